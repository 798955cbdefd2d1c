//! Unknown keys, found before the tables are read: every one is reported
//! (not just the first), with its line, table and the nearest valid key.

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::Report;

/// The keys a table takes: the fields of the struct that parses it, as
/// serde names them — one definition, so that a key the parser reads can
/// never be refused as unknown.
fn fields<'de, T: serde::Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

/// A deserializer that only records the field names a struct asks for.
struct Fields<'a>(&'a mut &'static [&'static str]);

/// Why [`Fields`] stops: it never has a value to give.
#[derive(Debug)]
struct Recorded;

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fields recorded")
    }
}

impl std::error::Error for Recorded {}

impl serde::de::Error for Recorded {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Self
    }
}

impl<'de> serde::Deserializer<'de> for Fields<'_> {
    type Error = Recorded;

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Recorded> {
        *self.0 = fields;
        Err(Recorded)
    }

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
        Err(Recorded)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        enum identifier ignored_any
    }
}

/// `[server]`'s keys (a policy that names one is pointed there).
pub(super) fn server() -> &'static [&'static str] {
    fields::<super::server::Raw>()
}

/// `[store]`'s keys.
pub(super) fn store() -> &'static [&'static str] {
    fields::<super::store::Raw>()
}

/// `[server.tls]`'s keys (and `internal_tls`'s, `grpc_tls`'s).
fn tls() -> &'static [&'static str] {
    fields::<super::server::RawTls>()
}

/// `[telemetry]`'s keys.
pub(super) fn telemetry() -> &'static [&'static str] {
    fields::<super::server::RawTelemetry>()
}

/// Reports every key of `table` that is not one of the known ones. A
/// policy's own parameters are checked by the policy (they depend on its
/// algorithm).
pub(super) fn check(table: &Spanned<DeTable<'_>>, report: &mut Report<'_>) {
    unknown(table.get_ref(), fields::<super::Raw>(), "top level", report);
    for (key, value) in table.get_ref() {
        let (known, place): (&[&str], &str) = match key.get_ref().as_ref() {
            "server" => (server(), "[server]"),
            "store" => (store(), "[store]"),
            "telemetry" => (telemetry(), "[telemetry]"),
            "jwt" => (fields::<super::jwt::Raw>(), "[jwt]"),
            "routes" => (fields::<super::routes::Raw>(), "[[routes]]"),
            "descriptors" => (fields::<super::descriptors::Raw>(), "[[descriptors]]"),
            "quota_buckets" => (fields::<super::buckets::Raw>(), "[[quota_buckets]]"),
            _ => continue,
        };
        match value.get_ref() {
            DeValue::Table(table) => {
                unknown(table, known, place, report);
                if place == "[server]" {
                    for name in super::server::TLS_TABLES {
                        if let Some(DeValue::Table(inner)) = table.get(name).map(Spanned::get_ref) {
                            unknown(inner, tls(), &format!("[server.{name}]"), report);
                        }
                    }
                }
            }
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let DeValue::Table(table) = item.get_ref() {
                        unknown(table, known, &format!("{place} #{}", i + 1), report);
                    }
                }
            }
            _ => {}
        }
    }
}

fn unknown(table: &DeTable<'_>, known: &[&str], place: &str, report: &mut Report<'_>) {
    for key in table.keys() {
        let name: &str = key.get_ref().as_ref();
        if known.contains(&name) {
            continue;
        }
        let nearest = known
            .iter()
            .map(|k| (strsim::damerau_levenshtein(name, k), *k))
            .filter(|(distance, k)| *distance <= 2.max(k.len() / 3))
            .min();
        let hint = match nearest {
            Some((_, k)) => format!("did you mean `{k}`?"),
            None => format!("valid: {}", known.join(", ")),
        };
        report.error(
            &key.span(),
            &format!("{place} {name}"),
            format!("unknown key ({hint})"),
        );
    }
}
