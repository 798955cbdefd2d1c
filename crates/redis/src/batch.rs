//! Batching: requests waiting for the connection go to Redis as one script
//! call, which decides them in the order they were queued — the decisions
//! of the same requests sent one call each, one after another.
//!
//! A batch never waits for more requests to arrive: a sender takes whatever
//! is queued when one of its [`IN_FLIGHT`] calls is free (one request when
//! the store is idle, many under load), so batching adds no latency; it
//! only lets one call's overhead (the round trip, `EVALSHA`, the Lua call,
//! `TIME`) carry many decisions. On a cluster a batch is split by hash slot
//! (one script call's keys must share one), and the slots' calls go out
//! together.

use std::cell::RefCell;
use std::sync::{Arc, PoisonError, Weak};

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::{Connection, MARKER, Reply, StoreError, parse};

/// Script calls of one store in flight at once: while one is in Redis the
/// next batch gathers, so Redis is never idle waiting for a round trip.
pub(crate) const IN_FLIGHT: usize = 2;

/// How long a call keeps its place among the [`IN_FLIGHT`]: a call slower
/// than this (a master that died, a Redis that stalls) lets the next batch
/// go without it, so that on a cluster one dead master's calls cannot hold
/// up the checks of the others until their deadline.
pub(crate) const HOLD: std::time::Duration = std::time::Duration::from_millis(5);

/// The most requests one script call decides (Redis runs nothing else
/// while a script runs: this bounds the stall, ~1 ms at worst here).
pub(crate) const MAX_BATCH: usize = 128;

/// One request: its header and checks, as the script reads them.
#[derive(Debug)]
pub(crate) struct Request {
    /// "N MODE TIME" (see `weir.lua`).
    pub(crate) head: String,
    pub(crate) keys: Vec<String>,
    pub(crate) specs: Vec<String>,
    /// The hash slot of its keys, on a cluster.
    pub(crate) slot: Option<u16>,
    /// With the generation marker.
    pub(crate) marker: bool,
    /// The store's deadline for a call.
    pub(crate) timeout: std::time::Duration,
    pub(crate) reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// The queue in front of a store's connection.
#[derive(Debug, Clone)]
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Request>,
}

impl Batcher {
    /// Starts the sender (on the current tokio runtime); it stops when the
    /// last handle is dropped.
    pub(crate) fn start(connection: Connection, script: redis::Script) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(send(requests, connection, None, Arc::new(script)));
        Self { queue }
    }

    /// Starts a sender with a connection of its own, opened from `client`
    /// on the current runtime; until it is open (or if it cannot be), the
    /// sender's calls go on `shared`, so that no check waits for a connect.
    fn start_connected(threads: &PerThread, shared: Connection, script: redis::Script) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let (opened, own) = oneshot::channel();
        let (client, config) = (threads.client.clone(), threads.config.clone());
        let registry = threads.opened.clone();
        // Alive while the sender's task is: a connection whose runtime is
        // gone is no longer one to ask.
        let sending = Arc::new(());
        let used = Arc::downgrade(&sending);
        tokio::spawn(async move {
            if let Ok(own) = client.get_connection_manager_with_config(config).await {
                let mut registry = registry.lock().unwrap_or_else(PoisonError::into_inner);
                registry.push((used, own.clone()));
                let _ = opened.send(Connection::Single(own));
            }
        });
        let script = Arc::new(script);
        tokio::spawn(async move {
            let _sending = sending;
            send(requests, shared, Some(own), script).await;
        });
        Self { queue }
    }

    /// Queues `request`; `None` if the sender is gone (the runtime is
    /// shutting down).
    pub(crate) fn submit(&self, request: Request) -> Option<()> {
        self.queue.send(request).ok()
    }
}

/// A single node's batches per thread: each thread that checks gets a
/// sender and a connection of its own on its own runtime, so that with a
/// runtime per core a check, its batch and its reply never cross threads.
#[derive(Debug, Clone)]
pub(crate) struct PerThread {
    pub(crate) client: redis::Client,
    pub(crate) config: redis::aio::ConnectionManagerConfig,
    /// Alive while any clone of the store is: a thread's sender for a store
    /// that is gone is dropped (and its task and connection end).
    pub(crate) alive: Arc<()>,
    /// The threads' connections, once open, each while its sender runs: the
    /// store's probe asks each, since after Redis comes back every one of
    /// them must reconnect.
    pub(crate) opened: Arc<std::sync::Mutex<Vec<Opened>>>,
}

/// A thread's connection, and whether its sender still runs.
pub(crate) type Opened = (Weak<()>, redis::aio::ConnectionManager);

thread_local! {
    static SENDERS: RefCell<Vec<(Weak<()>, Batcher)>> = const { RefCell::new(Vec::new()) };
}

impl PerThread {
    /// Queues `request` on this thread's sender for the store.
    pub(crate) fn submit(&self, shared: &Connection, request: Request) -> Option<()> {
        SENDERS.with_borrow_mut(|senders| {
            senders.retain(|(alive, _)| alive.strong_count() > 0);
            let mine = Arc::downgrade(&self.alive);
            let at = match senders.iter().position(|(alive, _)| alive.ptr_eq(&mine)) {
                Some(at) => at,
                None => {
                    let batcher = Batcher::start_connected(
                        self,
                        shared.clone(),
                        redis::Script::new(crate::SCRIPT),
                    );
                    senders.push((mine, batcher));
                    senders.len() - 1
                }
            };
            senders[at].1.submit(request)
        })
    }

    /// The threads' connections in use now.
    pub(crate) fn connections(&self) -> Vec<redis::aio::ConnectionManager> {
        let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        opened.retain(|(sending, _)| sending.strong_count() > 0);
        opened.iter().map(|(_, c)| c.clone()).collect()
    }
}

async fn send(
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut connection: Connection,
    mut own: Option<oneshot::Receiver<Connection>>,
    script: Arc<redis::Script>,
) {
    let calls = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut alone = true;
    loop {
        let Ok(call) = calls.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = requests.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match requests.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        if let Some(opening) = &mut own {
            match opening.try_recv() {
                Ok(opened) => (connection, own) = (opened, None),
                Err(oneshot::error::TryRecvError::Closed) => own = None,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
        }
        // The first call goes alone: on a fresh Redis it is answered
        // NOSCRIPT, loaded and sent again, and a second call in flight could
        // overtake it, deciding later requests first.
        if std::mem::take(&mut alone) {
            for group in by_call(batch) {
                decide(group, &connection, &script).await;
            }
            continue;
        }
        let call = Arc::new(call);
        for group in by_call(batch) {
            let (connection, script, call) = (connection.clone(), script.clone(), call.clone());
            tokio::spawn(async move {
                let decided = decide(group, &connection, &script);
                tokio::pin!(decided);
                if tokio::time::timeout(HOLD, &mut decided).await.is_err() {
                    drop(call);
                    decided.await;
                }
            });
        }
    }
}

/// Splits a batch into script calls: one per hash slot (and marker use),
/// each keeping the order its requests were queued in.
fn by_call(batch: Vec<Request>) -> Vec<Vec<Request>> {
    let mut groups: Vec<Vec<Request>> = Vec::new();
    for request in batch {
        let same =
            |g: &&mut Vec<Request>| g[0].slot == request.slot && g[0].marker == request.marker;
        match groups.iter_mut().find(same) {
            Some(group) => group.push(request),
            None => groups.push(vec![request]),
        }
    }
    groups
}

/// One script call deciding `group` in order; each request gets its answer
/// (or the call's error).
async fn decide(group: Vec<Request>, connection: &Connection, script: &redis::Script) {
    let mut invocation = script.prepare_invoke();
    let marker = group[0].marker;
    invocation.arg(if marker { "m" } else { "-" });
    for request in &group {
        invocation.arg(&request.head);
        for (key, spec) in request.keys.iter().zip(&request.specs) {
            invocation.key(key).arg(spec);
        }
    }
    if marker {
        invocation.key(MARKER);
    }
    // Callers bound their own wait too (queueing included).
    let timeout = group.iter().map(|r| r.timeout).max().unwrap_or_default();
    let call = async {
        match connection {
            Connection::Single(c) => invocation.invoke_async(&mut c.clone()).await,
            Connection::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    };
    let reply: Result<Vec<i64>, StoreError> = match tokio::time::timeout(timeout, call).await {
        Ok(reply) => reply.map_err(StoreError::Redis),
        Err(_) => Err(StoreError::Timeout(timeout)),
    };
    let mut rest: &[i64] = match &reply {
        Ok(reply) => reply,
        Err(_) => &[],
    };
    for request in group {
        let answer = match &reply {
            Err(e) => Err(e.clone()),
            Ok(_) => {
                let len = 2 + crate::PER_CHECK * request.keys.len();
                match rest.split_at_checked(len) {
                    Some((mine, others)) => {
                        rest = others;
                        parse(mine, request.keys.len())
                    }
                    None => Err(StoreError::Reply),
                }
            }
        };
        let _ = request.reply.send(answer);
    }
}
