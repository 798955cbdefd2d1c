//! The Redis protocol (RESP2) listener, `[server] resp`: applications in
//! any language ask weir with the Redis client they already hold.
//!
//! - `CL.THROTTLE key max_burst count period [quantity]` answers as
//!   redis-cell does (limited, limit, remaining, retry after and reset after
//!   in whole seconds rounded up; retry after `-1` when admitted), decided
//!   by weir's exact GCRA: `max_burst + 1` at once, `count` per `period`
//!   seconds. Each distinct (max_burst, count, period) is an ad-hoc policy of
//!   the table: at most [`crate::table::AD_HOC`] of them, those unused for a
//!   minute given up when room is needed.
//! - `WEIR.CHECK policy key [cost]`, `WEIR.REPORT policy key cost` and
//!   `WEIR.RELEASE policy key lease` on the configuration's policies, the
//!   same keys as the decision API's: `[admitted, remaining, retry_after_ms,
//!   reset_ms]`, and the lease a concurrency policy took.
//! - `PING`, `AUTH`, `HELLO` (protocol 2 or 3), `QUIT`, and the courtesies clients
//!   send on connecting (`CLIENT SETNAME`/`SETINFO`, `SELECT 0`, `COMMAND`).
//!
//! Commands are arrays of bulk strings, as every client library sends
//! them (no inline commands). The reader is a few lines of its own rather
//! than a general RESP decoder: it accepts only that shape, bounded —
//! [`MAX_ARGS`] arguments of at most [`MAX_ARG_BYTES`], at most
//! [`MAX_PENDING`] bytes of commands read ahead — so no input can nest,
//! recurse or make it allocate past the bound. Commands of a connection
//! are answered in order, one at a time; answers to pipelined commands are
//! written together, at most [`MAX_PENDING`] bytes of them at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use weir_core::store::LeaseOp;
use weir_core::{Decision, NANOS_PER_SEC, Nanos, Policy, Rate};

use crate::answer::{ApiError, lease_token, read_lease};
use crate::backend::{API_SCOPE, Check, scoped_key};
use crate::config::{OnStoreError, RespAuth, TableId};
use crate::engine::Ask;
use crate::metrics::Meters;
use crate::serve::{Accepted, InFlight, Open, Protocol, listen};
use crate::state::{AppState, Shared};
use crate::tls::{Alpn, Tls};

/// The most arguments of one command, its name included.
pub(crate) const MAX_ARGS: usize = 16;
/// The longest argument, in bytes.
pub(crate) const MAX_ARG_BYTES: usize = 4096;
/// The most bytes of commands read ahead of the one being answered (and of
/// answers kept before they are written).
pub(crate) const MAX_PENDING: usize = 64 * 1024;

/// What a client over the connection cap is told before it is closed.
const REFUSAL: &[u8] = b"-ERR max number of clients reached\r\n";

/// Serves the Redis protocol on `listener` until `shutdown` completes,
/// through the listeners' one accept loop (connection caps, header and
/// idle timeouts: a command that stalls mid-way is a stalled head).
pub async fn run_resp(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let server = &state.current().config.server;
    let limits = server.limits;
    let protocol = match &server.resp_tls {
        Some(files) => Protocol::Tls(Tls::new(files, Alpn::Http).map_err(std::io::Error::other)?),
        None => Protocol::Plain { refusal: REFUSAL },
    };
    let open: Arc<Mutex<Open>> = Arc::default();
    let serve = move |accepted: Accepted, _watcher: Watcher| {
        let state = state.clone();
        async move {
            if let Err(e) = connection(accepted, &state).await {
                tracing::debug!(error = %e, "RESP connection ended with an error");
            }
            Ok(())
        }
    };
    listen(listener, limits, open, shutdown, protocol, serve).await
}

/// A command's arguments: where each lies in the buffer it was read from.
type Ranges = smallvec::SmallVec<[std::ops::Range<usize>; 8]>;

/// Reads one command from the start of `buf`: its arguments and its length
/// in bytes; `Ok(None)` while it is incomplete.
fn command(buf: &[u8]) -> Result<Option<(Ranges, usize)>, &'static str> {
    /// The number after a type byte, up to `\r\n`, at `at`; its end.
    fn number(buf: &[u8], at: usize, kind: u8) -> Result<Option<(usize, usize)>, &'static str> {
        let Some(&first) = buf.get(at) else {
            return Ok(None);
        };
        if first != kind {
            return Err(match kind {
                b'*' => "expected an array of bulk strings (inline commands are not read)",
                _ => "expected a bulk string",
            });
        }
        let digits = &buf[at + 1..];
        let Some(end) = digits.iter().take(12).position(|&b| b == b'\r') else {
            return match digits.len() < 12 {
                true => Ok(None),
                false => Err("a length too long"),
            };
        };
        let text =
            std::str::from_utf8(&digits[..end]).map_err(|_| "a length that is not a number")?;
        let n: usize = text.parse().map_err(|_| "a length that is not a number")?;
        match digits.get(end + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((n, at + 1 + end + 2))),
            Some(_) => Err("a length not ended by CRLF"),
        }
    }
    let Some((count, mut at)) = number(buf, 0, b'*')? else {
        return Ok(None);
    };
    if count == 0 || count > MAX_ARGS {
        return Err("a command has 1 to 16 arguments");
    }
    let mut args = Ranges::new();
    for _ in 0..count {
        let Some((len, start)) = number(buf, at, b'$')? else {
            return Ok(None);
        };
        if len > MAX_ARG_BYTES {
            return Err("an argument longer than 4096 bytes");
        }
        let end = start + len;
        match buf.get(end..end + 2) {
            None => return Ok(None),
            Some(b"\r\n") => {}
            Some(_) => return Err("a bulk string not ended by CRLF"),
        }
        args.push(start..end);
        at = end + 2;
    }
    Ok(Some((args, at)))
}

/// One connection: commands read, answered in order, until the client
/// closes, says `QUIT`, or sends what is not a command.
async fn connection(accepted: Accepted, state: &AppState) -> std::io::Result<()> {
    let peer = accepted.peer;
    let activity = accepted.activity;
    let mut io = accepted.io.into_inner();
    let mut input = BytesMut::with_capacity(4096);
    let mut output = Vec::with_capacity(256);
    let mut session = Session {
        authenticated: state.current().config.server.resp_auth.is_none(),
        peer,
    };
    loop {
        // Every complete command read so far, answered in order.
        loop {
            match command(&input) {
                Ok(Some((ranges, len))) => {
                    let mut in_flight = InFlight::start(&activity);
                    let args: smallvec::SmallVec<[&[u8]; 8]> =
                        ranges.iter().map(|r| &input[r.clone()]).collect();
                    let quit = session.answer(state, &args, &mut output).await;
                    drop(args);
                    in_flight.finish();
                    input.advance(len);
                    if quit {
                        io.write_all(&output).await?;
                        return io.shutdown().await;
                    }
                    if output.len() >= MAX_PENDING {
                        io.write_all(&output).await?;
                        output.clear();
                    }
                }
                Ok(None) => break,
                Err(why) => {
                    error(&mut output, "ERR", &format!("Protocol error: {why}"));
                    io.write_all(&output).await?;
                    return io.shutdown().await;
                }
            }
        }
        if !output.is_empty() {
            io.write_all(&output).await?;
            output.clear();
        }
        if input.len() >= MAX_PENDING {
            error(
                &mut output,
                "ERR",
                "Protocol error: a command longer than 64 KiB",
            );
            io.write_all(&output).await?;
            return io.shutdown().await;
        }
        input.reserve(4096);
        if io.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
    }
}

/// A connection's state.
struct Session {
    authenticated: bool,
    peer: SocketAddr,
}

fn simple(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b"+");
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// An error line: `-CODE message`, the message on one line whatever a
/// client sent.
fn error(out: &mut Vec<u8>, code: &str, message: &str) {
    out.extend_from_slice(b"-");
    out.extend_from_slice(code.as_bytes());
    out.push(b' ');
    out.extend(
        message
            .bytes()
            .map(|b| if b.is_ascii_control() { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

fn integer(out: &mut Vec<u8>, n: i64) {
    out.push(b':');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

fn array(out: &mut Vec<u8>, len: usize) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// An argument as text, for a message (cut at 64 bytes).
fn shown(arg: &[u8]) -> String {
    String::from_utf8_lossy(&arg[..arg.len().min(64)]).into_owned()
}

/// Nanoseconds as whole units of `unit` nanoseconds, rounded up.
fn ceil(nanos: Nanos, unit: Nanos) -> i64 {
    i64::try_from(nanos.div_ceil(unit)).unwrap_or(i64::MAX)
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Why a command got no decision, as a RESP error.
fn refused(out: &mut Vec<u8>, e: ApiError) {
    let (_, code, message) = e.parts();
    error(out, code, &message);
}

/// A decision command's answer, counted in `weir_face_answers_total`:
/// admitted (released, for `WEIR.RELEASE`), limited, or not decided.
fn counted(command: &'static str, decided: Option<bool>) {
    let outcome = match decided {
        Some(true) => "admitted",
        Some(false) => "limited",
        None => "invalid",
    };
    Meters::answered("resp", Some(command), outcome);
}

/// [`error`], for a decision command: no decision.
fn failed(out: &mut Vec<u8>, code: &str, message: &str) -> Option<bool> {
    error(out, code, message);
    None
}

/// [`refused`], for a decision command: no decision.
fn undecided(out: &mut Vec<u8>, e: ApiError) -> Option<bool> {
    refused(out, e);
    None
}

impl Session {
    /// Answers one command into `out`; true when the connection ends.
    async fn answer(&mut self, state: &AppState, args: &[&[u8]], out: &mut Vec<u8>) -> bool {
        let name = args[0].to_ascii_uppercase();
        let rest = &args[1..];
        let shared = state.current();
        let auth = &shared.config.server.resp_auth;
        match (name.as_slice(), rest.len()) {
            (b"QUIT", _) => {
                simple(out, "OK");
                return true;
            }
            (b"AUTH", 1 | 2) => self.auth(auth.as_ref(), rest, out),
            (b"HELLO", _) => self.hello(auth.as_ref(), rest, out),
            _ if !self.authenticated => error(out, "NOAUTH", "Authentication required."),
            (b"PING", 0) => simple(out, "PONG"),
            (b"PING", 1) => bulk(out, rest[0]),
            (b"CLIENT", 1..) | (b"SELECT", 1) => simple(out, "OK"),
            (b"COMMAND", _) => array(out, 0),
            (b"CL.THROTTLE", 4 | 5) => {
                let decided = throttle(state, &shared, self.peer, rest, out).await;
                counted("cl.throttle", decided);
            }
            (b"WEIR.CHECK", 2 | 3) => {
                let decided = charge(&shared, self.peer, rest, out, false).await;
                counted("weir.check", decided);
            }
            (b"WEIR.REPORT", 3) => {
                let decided = charge(&shared, self.peer, rest, out, true).await;
                counted("weir.report", decided);
            }
            (b"WEIR.RELEASE", 3) => counted("weir.release", release(&shared, rest, out).await),
            (
                b"AUTH" | b"PING" | b"SELECT" | b"CL.THROTTLE" | b"WEIR.CHECK" | b"WEIR.REPORT"
                | b"WEIR.RELEASE",
                _,
            ) => error(
                out,
                "ERR",
                &format!(
                    "wrong number of arguments for '{}' command",
                    shown(&name).to_lowercase()
                ),
            ),
            _ => error(
                out,
                "ERR",
                &format!(
                    "unknown command '{}' (weir answers CL.THROTTLE, WEIR.CHECK, WEIR.REPORT, WEIR.RELEASE, PING, AUTH, HELLO, QUIT)",
                    shown(args[0])
                ),
            ),
        }
        false
    }

    /// `AUTH [user] password`.
    fn auth(&mut self, auth: Option<&RespAuth>, rest: &[&[u8]], out: &mut Vec<u8>) {
        let (user, password) = match rest {
            [password] => (&b"default"[..], *password),
            [user, password] => (*user, *password),
            _ => unreachable!("AUTH takes 1 or 2 arguments"),
        };
        match auth {
            None => error(
                out,
                "ERR",
                "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ),
            Some(auth)
                if same(user, auth.user.as_bytes()) & same(password, auth.password.as_bytes()) =>
            {
                self.authenticated = true;
                simple(out, "OK");
            }
            Some(_) => error(
                out,
                "WRONGPASS",
                "invalid username-password pair or user is disabled.",
            ),
        }
    }

    /// `HELLO [2|3 [AUTH user password] [SETNAME name]]`. Every answer
    /// weir gives is the same in RESP2 and RESP3 (integers, arrays, bulk
    /// and simple strings, errors), but `HELLO`'s own: a map in RESP3.
    fn hello(&mut self, auth: Option<&RespAuth>, rest: &[&[u8]], out: &mut Vec<u8>) {
        let version = match rest.first().copied() {
            None | Some(b"2") => 2,
            Some(b"3") => 3,
            Some(_) => {
                error(
                    out,
                    "NOPROTO",
                    "sorry, this protocol version is not supported.",
                );
                return;
            }
        };
        let mut options = rest.iter().skip(1);
        while let Some(option) = options.next() {
            match option.to_ascii_uppercase().as_slice() {
                b"AUTH" => {
                    let (Some(user), Some(password)) = (options.next(), options.next()) else {
                        error(out, "ERR", "Syntax error in HELLO option 'auth'");
                        return;
                    };
                    let mut said = Vec::new();
                    self.auth(auth, &[user, password], &mut said);
                    if !self.authenticated {
                        out.extend_from_slice(&said);
                        return;
                    }
                }
                b"SETNAME" if options.next().is_some() => {}
                _ => {
                    error(
                        out,
                        "ERR",
                        &format!("Syntax error in HELLO option '{}'", shown(option)),
                    );
                    return;
                }
            }
        }
        if !self.authenticated {
            error(
                out,
                "NOAUTH",
                "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            );
            return;
        }
        match version {
            3 => out.extend_from_slice(b"%7\r\n"),
            _ => array(out, 14),
        }
        for (key, value) in [("server", "weir"), ("version", env!("CARGO_PKG_VERSION"))] {
            bulk(out, key.as_bytes());
            bulk(out, value.as_bytes());
        }
        bulk(out, b"proto");
        integer(out, version);
        bulk(out, b"id");
        integer(out, 0);
        for (key, value) in [("mode", "standalone"), ("role", "master")] {
            bulk(out, key.as_bytes());
            bulk(out, value.as_bytes());
        }
        bulk(out, b"modules");
        array(out, 0);
    }
}

/// An argument that must be a whole number, at least `min`.
fn number(out: &mut Vec<u8>, arg: &[u8], name: &str, min: u64) -> Option<u64> {
    let parsed = std::str::from_utf8(arg)
        .ok()
        .and_then(|t| t.parse::<u64>().ok());
    match parsed {
        Some(n) if n >= min => Some(n),
        _ => {
            error(
                out,
                "ERR",
                &format!(
                    "{name} must be a whole number of at least {min}, not '{}'",
                    shown(arg)
                ),
            );
            None
        }
    }
}

/// An argument that must be text (a policy's name, a key).
fn text<'a>(out: &mut Vec<u8>, arg: &'a [u8], name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(arg).ok();
    if text.is_none() {
        error(out, "ERR", &format!("{name} must be UTF-8 text"));
    }
    text
}

/// The policy named `name`, as its override for `key` decides it.
fn policy(out: &mut Vec<u8>, shared: &Shared, name: &str, key: &str) -> Option<TableId> {
    let Some(id) = shared.table.find(name) else {
        refused(out, ApiError::UnknownPolicy(name.to_owned()));
        return None;
    };
    Some(shared.resolve(id, key))
}

/// `CL.THROTTLE key max_burst count period [quantity]`.
async fn throttle(
    state: &AppState,
    shared: &Arc<Shared>,
    peer: SocketAddr,
    rest: &[&[u8]],
    out: &mut Vec<u8>,
) -> Option<bool> {
    let key = text(out, rest[0], "the key")?;
    let burst = number(out, rest[1], "max_burst", 0)?;
    let count = number(out, rest[2], "count", 1)?;
    let period = number(out, rest[3], "period", 1)?;
    let quantity = match rest.get(4) {
        Some(q) => number(out, q, "quantity", 0)?,
        None => 1,
    };
    let policy = (period.checked_mul(NANOS_PER_SEC))
        .and_then(|period| Rate::new(count, period))
        .and_then(|rate| Policy::gcra(burst.saturating_add(1), rate).ok());
    let Some(policy) = policy else {
        let message =
            "max_burst + 1 tokens at count per period seconds is not a rate weir can keep";
        return failed(out, "ERR", message);
    };
    let stored_as = format!("cl.throttle@{burst}-{count}-per-{period}s");
    let ad_hoc = |shared: &Shared| shared.table.ad_hoc(&stored_as, "cl.throttle", policy, None);
    // Every slot taken by a limit named within the last minute: room is
    // made once (the limits unused for a minute given up), and it is asked
    // again.
    let found = match ad_hoc(shared) {
        Some(id) => Some((shared.clone(), id)),
        None if state.make_room(shared) => {
            let shared = state.current();
            ad_hoc(&shared).map(|id| (shared, id))
        }
        None => None,
    };
    let Some((shared, id)) = found else {
        let message = "too many distinct CL.THROTTLE limits named within the last minute";
        return failed(out, "ERR", message);
    };
    let key = match scoped_key("cell", key) {
        Ok(key) => key,
        Err(e) => return undecided(out, e.into()),
    };
    let checks = [Check {
        policy: id,
        key: &key,
        cost: quantity,
    }];
    let verdict = shared
        .decide(Ask {
            checks: &checks,
            client: Some(peer.ip()),
            max_delay: 0,
            on_store_error: Some(OnStoreError::Local),
            probe: false,
        })
        .await;
    let verdict = match verdict {
        Ok(verdict) => verdict,
        Err(e) => return undecided(out, e.into()),
    };
    let d = verdict.decisions().next()?;
    let allowed = verdict.all.allowed;
    array(out, 5);
    integer(out, i64::from(!allowed));
    integer(
        out,
        i64::try_from(burst.saturating_add(1)).unwrap_or(i64::MAX),
    );
    integer(out, i64::try_from(d.remaining).unwrap_or(i64::MAX));
    integer(
        out,
        if allowed {
            -1
        } else {
            ceil(d.retry_after, NANOS_PER_SEC)
        },
    );
    integer(out, ceil(d.reset, NANOS_PER_SEC));
    Some(allowed)
}

/// `[admitted, remaining, retry_after_ms, reset_ms]` (and the lease);
/// whether admitted.
fn decision(out: &mut Vec<u8>, allowed: bool, d: &Decision, degraded: bool) -> bool {
    const MS: Nanos = 1_000_000;
    array(out, 4 + usize::from(d.lease.is_some()));
    integer(out, i64::from(allowed));
    integer(out, i64::try_from(d.remaining).unwrap_or(i64::MAX));
    // Admitted by a shaper: how long to wait before going on.
    let wait = if allowed { d.delay } else { d.retry_after };
    integer(out, ceil(wait, MS));
    integer(out, ceil(d.reset, MS));
    if let Some(lease) = d.lease {
        bulk(out, lease_token(lease, degraded).as_bytes());
    }
    allowed
}

/// The (policy, key) of `WEIR.*` commands: the policy as overridden for the
/// key, the key as the decision API stores it.
fn named(out: &mut Vec<u8>, shared: &Shared, rest: &[&[u8]]) -> Option<(TableId, String)> {
    let name = text(out, rest[0], "the policy")?;
    let key = text(out, rest[1], "the key")?;
    let id = policy(out, shared, name, key)?;
    match scoped_key(API_SCOPE, key) {
        Ok(key) => Some((id, key)),
        Err(e) => {
            refused(out, e.into());
            None
        }
    }
}

/// `WEIR.CHECK policy key [cost]`, or (`report`) `WEIR.REPORT policy key
/// cost`: charged, never refused.
async fn charge(
    shared: &Shared,
    peer: SocketAddr,
    rest: &[&[u8]],
    out: &mut Vec<u8>,
    report: bool,
) -> Option<bool> {
    let (id, key) = named(out, shared, rest)?;
    let cost = match rest.get(2) {
        Some(c) => number(out, c, "cost", 0)?,
        None => 1,
    };
    let checks = [Check {
        policy: id,
        key: &key,
        cost,
    }];
    let client = Some(peer.ip());
    if report {
        return match shared.report(&checks, client).await {
            Ok(decided) => Some(decision(out, true, decided.first()?, false)),
            Err(e) => undecided(out, e.into()),
        };
    }
    let ask = Ask {
        checks: &checks,
        client,
        max_delay: Nanos::MAX,
        on_store_error: Some(OnStoreError::Local),
        probe: false,
    };
    match shared.decide(ask).await {
        Ok(verdict) => {
            let d = verdict.decisions().next()?;
            Some(decision(out, verdict.all.allowed, &d, verdict.degraded))
        }
        Err(e) => undecided(out, e.into()),
    }
}

/// `WEIR.RELEASE policy key lease`: admitted (1) when the lease was live.
async fn release(shared: &Shared, rest: &[&[u8]], out: &mut Vec<u8>) -> Option<bool> {
    let (id, key) = named(out, shared, rest)?;
    let Some((lease, local)) = std::str::from_utf8(rest[2]).ok().and_then(read_lease) else {
        return failed(
            out,
            "ERR",
            "the lease is not one WEIR.CHECK answered (16 hex digits)",
        );
    };
    match shared
        .on_lease(id, &key, LeaseOp::Release(lease), local)
        .await
    {
        Ok(d) => Some(decision(out, d.allowed, &d, local)),
        Err(e) => undecided(out, e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_are_read_whole_or_not_at_all() {
        let wire = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n";
        let (args, len) = command(wire).unwrap().unwrap();
        assert_eq!(len, 22);
        assert_eq!(&wire[args[0].clone()], b"PING");
        assert_eq!(&wire[args[1].clone()], b"hi");
        for cut in 0..22 {
            assert_eq!(command(&wire[..cut]), Ok(None), "{cut}");
        }
        for bad in [
            &b"PING\r\n"[..],
            b"*0\r\n",
            b"*17\r\n",
            b"*1\r\n*1\r\n",
            b"*1\r\n$4097\r\n",
            b"*1\r\n$1\r\nab\r\n",
            b"*1x\r\n",
            b"*99999999999999\r\n",
        ] {
            assert!(command(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    proptest! {
        /// Whatever a client sends, the reader answers without panicking,
        /// and a command it reads lies within the bytes it was given.
        #[test]
        fn any_bytes_are_read_safely(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((args, len))) = command(&bytes) {
                prop_assert!(len <= bytes.len());
                prop_assert!(args.iter().all(|r| r.end <= len));
            }
        }
    }
}
