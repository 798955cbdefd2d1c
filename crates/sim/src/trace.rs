//! Reading traces: CSV with a header naming `time` (seconds, decimal, at most
//! nine fractional digits) and optionally `cost` (whole number, default 1),
//! `key` (default `default`), `op` (`check`, `report`, `release` or `renew`,
//! default `check`) and `lease` (a concurrency policy's lease: the one a
//! check would take, or the one a release or renewal acts on), in any order.
//! Rows are taken in file order. An empty `cost`, `key` or `op` field takes
//! the column's default.

use std::io::Read;

use thiserror::Error;
use weir_core::Nanos;
use weir_core::units::{parse_count, parse_seconds};

/// The key of rows that name none.
pub const DEFAULT_KEY: &str = "default";

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The time as written (echoed in the output).
    pub time_text: String,
    /// The time in nanoseconds.
    pub time: Nanos,
    /// The key (identity) checked.
    pub key: String,
    /// The request's cost.
    pub cost: u64,
    /// A check or a report; `None` when the trace has no `op` column (the
    /// output then has none either).
    pub op: Option<Op>,
    /// The lease's name; `None` when the trace has no `lease` column (the
    /// output then has none either), empty when the row names none.
    pub lease: Option<String>,
    /// The line of the trace it came from (1 is the header).
    pub line: u64,
}

/// What a row does (docs/SPEC.md, "Usage reported after the fact").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A request that may be refused.
    Check,
    /// Usage charged after the fact, always.
    Report,
    /// Answered as a check, charging nothing (docs/SPEC.md's probe).
    Probe,
    /// Frees a concurrency policy's lease (its cost is ignored).
    Release,
    /// Extends a concurrency policy's lease (its cost is ignored).
    Renew,
}

impl Op {
    /// As written in traces and output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::Report => "report",
            Self::Probe => "probe",
            Self::Release => "release",
            Self::Renew => "renew",
        }
    }
}

impl Arrival {
    /// An arrival made in code (scenarios, tests).
    pub fn new(time: Nanos, key: &str, cost: u64) -> Self {
        Self {
            time_text: weir_core::units::Seconds(time).to_string(),
            time,
            key: key.to_owned(),
            cost,
            op: None,
            lease: None,
            line: 0,
        }
    }
}

/// A trace that cannot be read, with the line where it went wrong.
#[derive(Debug, Error)]
#[error("line {line}: {message}")]
pub struct TraceError {
    /// The 1-based line (the header is line 1).
    pub line: u64,
    /// What is wrong and what would be valid.
    pub message: String,
}

#[derive(Debug, Clone, Copy)]
struct Columns {
    time: usize,
    cost: Option<usize>,
    key: Option<usize>,
    op: Option<usize>,
    lease: Option<usize>,
}

/// Reads arrivals one by one, so a long trace is never held in memory and
/// nothing after a bad row is read.
pub struct TraceReader<R: Read> {
    records: csv::StringRecordsIntoIter<R>,
    columns: Result<Columns, Option<TraceError>>,
}

impl<R: Read> TraceReader<R> {
    /// Starts reading; the header is checked on the first call to `next`.
    pub fn new(input: R) -> Self {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .trim(csv::Trim::All)
            .from_reader(input);
        let columns = read_header(&mut reader).map_err(Some);
        Self {
            records: reader.into_records(),
            columns,
        }
    }
}

impl<R: Read> std::fmt::Debug for TraceReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader")
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

fn read_header<R: Read>(reader: &mut csv::Reader<R>) -> Result<Columns, TraceError> {
    let header_error = |message: String| TraceError { line: 1, message };
    let headers = reader
        .headers()
        .map_err(|e| header_error(format!("cannot read the header: {e}")))?
        .clone();
    let (mut time, mut cost, mut key, mut op, mut lease) = (None, None, None, None, None);
    for (i, name) in headers.iter().enumerate() {
        let slot = match name {
            "time" => &mut time,
            "cost" => &mut cost,
            "key" => &mut key,
            "op" => &mut op,
            "lease" => &mut lease,
            "" if headers.len() == 1 => {
                return Err(header_error(
                    "the trace is empty: expected a header with a `time` column".into(),
                ));
            }
            other => {
                return Err(header_error(format!(
                    "unknown column `{other}` (valid columns: time, cost, key, op, lease)"
                )));
            }
        };
        if slot.replace(i).is_some() {
            return Err(header_error(format!("column `{name}` appears twice")));
        }
    }
    let time = time.ok_or_else(|| {
        header_error("the header has no `time` column (columns: time, cost, key, op, lease)".into())
    })?;
    Ok(Columns {
        time,
        cost,
        key,
        op,
        lease,
    })
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Arrival, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let columns = match &mut self.columns {
            Ok(columns) => *columns,
            Err(error) => return error.take().map(Err),
        };
        let record = match self.records.next()? {
            Ok(record) => record,
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                self.columns = Err(None);
                return Some(Err(TraceError {
                    line,
                    message: csv_message(&e),
                }));
            }
        };
        let line = record.position().map_or(0, |p| p.line());
        let result = parse_row(&record, columns, line);
        if result.is_err() {
            self.columns = Err(None);
        }
        Some(result)
    }
}

fn csv_message(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => {
            format!("expected {expected_len} fields as in the header, found {len}")
        }
        csv::ErrorKind::Utf8 { .. } => "the row is not valid UTF-8".to_owned(),
        _ => e.to_string(),
    }
}

fn parse_row(
    record: &csv::StringRecord,
    columns: Columns,
    line: u64,
) -> Result<Arrival, TraceError> {
    let error = |message: String| TraceError { line, message };
    let field = |i: Option<usize>| i.and_then(|i| record.get(i)).filter(|s| !s.is_empty());
    let time_text = record.get(columns.time).unwrap_or_default();
    let time =
        parse_seconds(time_text).map_err(|e| error(format!("`time` \"{time_text}\": {e}")))?;
    let cost = match field(columns.cost) {
        None => 1,
        Some("0") => 0,
        Some(text) => parse_count(text).map_err(|_| {
            error(format!(
                "`cost` \"{text}\": expected a whole number such as 0, 1 or 5"
            ))
        })?,
    };
    let op = match (columns.op, field(columns.op)) {
        (None, _) => None,
        (Some(_), None | Some("check")) => Some(Op::Check),
        (Some(_), Some("report")) => Some(Op::Report),
        (Some(_), Some("probe")) => Some(Op::Probe),
        (Some(_), Some("release")) => Some(Op::Release),
        (Some(_), Some("renew")) => Some(Op::Renew),
        (Some(_), Some(other)) => {
            return Err(error(format!(
                "`op` \"{other}\": expected \"check\", \"probe\", \"report\", \"release\" or \"renew\""
            )));
        }
    };
    let lease = columns
        .lease
        .map(|_| field(columns.lease).unwrap_or_default().to_owned());
    if matches!(op, Some(Op::Release | Op::Renew)) && lease.as_deref().is_none_or(str::is_empty) {
        return Err(error(format!(
            "`op` \"{}\" needs the lease it acts on in a `lease` column",
            op.map_or("", Op::name)
        )));
    }
    let key = field(columns.key).unwrap_or(DEFAULT_KEY).to_owned();
    Ok(Arrival {
        time_text: time_text.to_owned(),
        time,
        key,
        cost,
        op,
        lease,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Vec<Result<Arrival, String>> {
        TraceReader::new(text.as_bytes())
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn columns_in_any_order_with_defaults() {
        let rows = read("key,time,cost\na,0.5,2\n,1,\n");
        let rows: Vec<_> = rows.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            (
                rows[0].key.as_str(),
                rows[0].time,
                rows[0].cost,
                rows[0].line
            ),
            ("a", 500_000_000, 2, 2)
        );
        assert_eq!((rows[1].key.as_str(), rows[1].cost), ("default", 1));
    }

    #[test]
    fn errors_name_the_line_and_stop() {
        assert_eq!(
            read("time,colour\n0,red\n"),
            vec![Err(
                "line 1: unknown column `colour` (valid columns: time, cost, key, op, lease)"
                    .into()
            )]
        );
        assert_eq!(
            read("cost\n1\n"),
            vec![Err(
                "line 1: the header has no `time` column (columns: time, cost, key, op, lease)"
                    .into()
            )]
        );
        let rows = read("time\n0\nsoon\n1\n");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1], Err("line 3: `time` \"soon\": expected seconds as a non-negative decimal such as 0, 12 or 59.9".into()));
        let rows = read("time,cost\n0,1\n0,-1\n");
        assert_eq!(
            rows[1],
            Err("line 3: `cost` \"-1\": expected a whole number such as 0, 1 or 5".into())
        );
        let rows = read("time,cost\n0,1\n0,1,3\n0\n");
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[1],
            Err("line 3: expected 2 fields as in the header, found 3".into())
        );
        assert_eq!(
            read(""),
            vec![Err(
                "line 1: the header has no `time` column (columns: time, cost, key, op, lease)"
                    .into()
            )]
        );
        assert!(
            read("time,time\n0,0\n")[0]
                .as_ref()
                .unwrap_err()
                .contains("twice")
        );
    }

    proptest::proptest! {
        /// Whatever the bytes, the reader yields rows and at most one error,
        /// and nothing after it.
        #[test]
        fn any_input_reads_or_stops_at_one_error(text in "(time|cost|key|,|\\n|[0-9.\\-e\"]|[ -~]){0,120}") {
            let rows: Vec<_> = TraceReader::new(text.as_bytes()).collect();
            let errors = rows.iter().filter(|r| r.is_err()).count();
            proptest::prop_assert!(errors <= 1);
            if errors == 1 {
                proptest::prop_assert!(rows.last().is_some_and(Result::is_err));
            }
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes (invalid UTF-8, NULs, stray quotes): no panic,
        /// and every error names a line.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let header = b"time,cost,key\n".to_vec();
            for input in [bytes.clone(), [header, bytes].concat()] {
                for row in TraceReader::new(input.as_slice()) {
                    if let Err(e) = row {
                        proptest::prop_assert!(!e.message.is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn quoted_keys() {
        let rows = read("time,key\n0,\"a,b\"\n");
        assert_eq!(rows[0].as_ref().unwrap().key, "a,b");
    }
}
