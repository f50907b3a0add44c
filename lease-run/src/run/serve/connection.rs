//! One connection: the handshake, then its requests read within the shared budget and
//! answered (reads at once, writes through the committer).

use super::state::*;
use crate::error::RunError;
use crate::run::RunStore;
use crate::store_socket::{
    Answer, HANDSHAKE_DEADLINE, Hello, IDLE_TIMEOUT, MAX_ANSWER, MAX_FRAME, MAX_HELLO, Op, Proof,
    READ_TIMEOUT, Side, VERSION, WireCommit, WireDoc, batch_of, nonce, nonce_of, prove,
    stranger_refusal, transcript, verify,
};
use lease_core::Code;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::time::timeout;

/// Send a small frame without waiting (a refusal to a peer that may not read).
pub(super) fn try_send(s: &UnixStream, a: &Answer) {
    let mut buf = Vec::new();
    if let Ok(body) = serde_json::to_vec(a)
        && crate::store_socket::write_frame(&mut buf, &body).is_ok()
    {
        let _ = s.try_write(&buf);
    }
}

pub(super) async fn send(s: &mut UnixStream, a: &Answer) -> std::io::Result<()> {
    let mut body = serde_json::to_vec(a).map_err(std::io::Error::other)?;
    if body.len() > MAX_ANSWER {
        // One document or commit larger than a request can carry (written by the owner's
        // library API): said, not sent cut.
        let r = Answer::refused(
            Code::ArgumentInvalid,
            format!(
                "the answer of {} bytes is over the store socket's limit of {MAX_ANSWER} (one document or commit larger than a request can carry); read it with the run's library API or once the run is released",
                body.len()
            ),
        );
        body = serde_json::to_vec(&r).map_err(std::io::Error::other)?;
    }
    // The frame as the client reads it (one definition of the format), then sent whole.
    let mut buf = Vec::with_capacity(4 + body.len());
    crate::store_socket::write_frame(&mut buf, &body)?;
    s.write_all(&buf).await
}

/// Read one pre-authentication frame into `buf`; a longer one than [`MAX_HELLO`] is
/// refused unread. `Err(None)`: the peer closed or failed (nothing to say).
pub(super) async fn read_small<'a>(
    s: &mut UnixStream,
    buf: &'a mut [u8; MAX_HELLO],
) -> Result<&'a [u8], Option<Answer>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.map_err(|_| None)?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_HELLO {
        return Err(Some(stranger_refusal(&format!(
            "a frame of {n} bytes before authentication (at most {MAX_HELLO})"
        ))));
    }
    let body = &mut buf[..n];
    s.read_exact(body).await.map_err(|_| None)?;
    Ok(body)
}

/// The handshake, owner's side (module docs of [`crate::store_socket`]); returns the
/// generation the authenticated client claims.
pub(super) async fn handshake(
    s: &mut UnixStream,
    ctx: &Ctx,
    spoke: &AtomicBool,
) -> Result<u64, Option<Answer>> {
    let not_hello = || Some(stranger_refusal("not a store hello"));
    let mut buf = [0u8; MAX_HELLO];
    /// The version alone, to say so when it is another protocol's first frame.
    #[derive(serde::Deserialize)]
    struct Versioned {
        v: u32,
    }
    let hello: Hello = {
        let frame = read_small(s, &mut buf).await?;
        match serde_json::from_slice::<Versioned>(frame) {
            Ok(Versioned { v }) if v != VERSION => {
                return Err(Some(stranger_refusal(&format!(
                    "store protocol version {v} is not spoken here (version {VERSION})"
                ))));
            }
            _ => serde_json::from_slice(frame).map_err(|_| not_hello())?,
        }
    };
    let cn = nonce_of(&hello.nonce).ok_or_else(not_hello)?;
    // A whole, well-formed hello: no longer evicted before the silent ones.
    spoke.store(true, Ordering::Relaxed);
    let sn = nonce().map_err(|_| None)?;
    let key = &ctx.shared.incarnation;
    let g = hello.generation;
    let challenge = crate::store_socket::Challenge {
        v: VERSION,
        nonce: hex::encode(sn),
        proof: hex::encode(prove(
            key,
            &transcript(Side::Server, &ctx.name, &cn, &sn, g),
        )),
    };
    let body = serde_json::to_vec(&challenge).map_err(|_| None)?;
    let mut frame = Vec::new();
    crate::store_socket::write_frame(&mut frame, &body).map_err(|_| None)?;
    s.write_all(&frame).await.map_err(|_| None)?;
    let refused = || Some(stranger_refusal("not authenticated"));
    let proof: Proof = {
        let frame = read_small(s, &mut buf).await?;
        serde_json::from_slice(frame).map_err(|_| refused())?
    };
    let t = transcript(Side::Client, &ctx.name, &cn, &sn, g);
    match hex::decode(&proof.proof).ok() {
        Some(p) if verify(key, &t, &p) => Ok(g),
        _ => Err(refused()),
    }
}

/// Serve one connection: the handshake within [`HANDSHAKE_DEADLINE`], then requests in
/// order until the peer closes it, idles past [`IDLE_TIMEOUT`], or sends a frame that is
/// too long (refused, then closed).
pub(super) async fn connection(mut s: UnixStream, ctx: Arc<Ctx>, id: u64, spoke: Arc<AtomicBool>) {
    let slot = Unslot {
        ctx: ctx.clone(),
        id,
    };
    let generation = match timeout(HANDSHAKE_DEADLINE, handshake(&mut s, &ctx, &spoke)).await {
        Ok(Ok(g)) => g,
        Ok(Err(refusal)) => {
            if let Some(r) = refusal {
                try_send(&s, &r);
            }
            return;
        }
        Err(_) => {
            try_send(
                &s,
                &stranger_refusal(&format!(
                    "the handshake did not finish within {} ms",
                    HANDSHAKE_DEADLINE.as_millis()
                )),
            );
            return;
        }
    };
    drop(slot);
    let shared = &ctx.shared;
    let run = &shared.run;
    let Ok(permit) = ctx.authenticated.clone().try_acquire_owned() else {
        try_send(
            &s,
            &Answer::refused(
                Code::StoreRequestRefused,
                format!(
                    "run {run}: the store socket already serves {} connections (its limit, from the descriptor limit): close one and try again; nothing was requested",
                    ctx.limits.authenticated
                ),
            ),
        );
        return;
    };
    // mutant socket_generation_stamp_ignored: an older generation's command is served (I3, §11.2).
    let welcome = if generation != shared.generation.get()
        && !lease_core::mutant::mutant("socket_generation_stamp_ignored")
    {
        Answer::refused(
            Code::Fenced,
            format!(
                "run {run}: the command is of generation {generation}, but this owner is generation {}",
                shared.generation
            ),
        )
    } else if let Err(e) = shared.check_live() {
        refusal(&e)
    } else {
        Answer {
            ok: true,
            run: Some(run.clone()),
            root: Some(ctx.root),
            generation: Some(shared.generation.get()),
            ..Answer::default()
        }
    };
    let welcomed = welcome.ok;
    if !matches!(
        timeout(READ_TIMEOUT, send(&mut s, &welcome)).await,
        Ok(Ok(()))
    ) || !welcomed
    {
        return;
    }
    // To the other runtime: its requests never wait behind the doorway's work.
    let Ok(std) = s.into_std() else {
        return;
    };
    let c = ctx.clone();
    ctx.served.spawn(async move {
        let _permit = permit;
        if let Ok(s) = UnixStream::from_std(std) {
            requests(s, &c, id).await;
        }
    });
}

/// The requests of an authenticated connection.
pub(super) async fn requests(s: UnixStream, ctx: &Arc<Ctx>, from: u64) {
    let run = &ctx.shared.run;
    let mut s = tokio::io::BufReader::with_capacity(READ_AHEAD, s);
    loop {
        let mut len = [0u8; 4];
        if !matches!(
            timeout(IDLE_TIMEOUT, s.read_exact(&mut len)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let n = u32::from_be_bytes(len) as usize;
        if n > MAX_FRAME {
            let a = Answer::refused(
                Code::ArgumentInvalid,
                format!("run {run}: a request of {n} bytes (at most {MAX_FRAME})"),
            );
            let _ = timeout(READ_TIMEOUT, send(s.get_mut(), &a)).await;
            return;
        }
        let units = u32::try_from(n.div_ceil(MEM_UNIT).max(1)).unwrap_or(u32::MAX);
        let Ok(_bytes) = ctx.request_bytes.clone().acquire_many_owned(units).await else {
            return;
        };
        let mut body = vec![0u8; n];
        if !matches!(
            timeout(READ_TIMEOUT, s.read_exact(&mut body)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let answer = match serde_json::from_slice::<Op>(&body) {
            Err(e) => Answer::refused(
                Code::ArgumentInvalid,
                format!("run {run}: not a store request: {e}"),
            ),
            Ok(op) => {
                drop(body);
                handle(op, ctx, from).await
            }
        };
        if !matches!(
            timeout(READ_TIMEOUT, send(s.get_mut(), &answer)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}

/// Carry out an authenticated request.
pub(super) async fn handle(op: Op, ctx: &Arc<Ctx>, from: u64) -> Answer {
    let shared = &ctx.shared;
    let run = &shared.run;
    if let Err(e) = shared.check_live() {
        return refusal(&e);
    }
    let store = RunStore {
        shared: shared.clone(),
    };
    match op {
        Op::Commit { writes, log } => {
            let batch = match batch_of(&writes, &log) {
                Ok(b) => b,
                Err(e) => {
                    return Answer::refused(Code::ArgumentInvalid, format!("run {run}: {e}"));
                }
            };
            drop((writes, log));
            let (reply, answer) = oneshot::channel();
            let request = Queued { from, batch, reply };
            if ctx.tx.send(request).await.is_err() {
                return refusal(&RunError::Released { run: run.clone() });
            }
            answer
                .await
                .unwrap_or_else(|_| refusal(&RunError::Released { run: run.clone() }))
        }
        Op::Release => {
            shared.release_request.notify_one();
            Answer {
                ok: true,
                accepted: Some(true),
                ..Answer::default()
            }
        }
        read => {
            let r = tokio::task::spawn_blocking(move || read_op(&store, read)).await;
            match r {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => refusal(&e),
                Err(e) => refusal(&RunError::Io(format!("run {run}: read task: {e}"))),
            }
        }
    }
}

/// Counts the bytes written to it.
pub(super) struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The length of `v` as JSON, plus its separator.
pub(super) fn encoded_len<T: serde::Serialize>(v: &T) -> usize {
    let mut c = Count(1);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Take entries while the page stays under [`PAGE_BYTES`] (the first always) and under
/// `limit`; whether some were left.
pub(super) fn page<T: serde::Serialize>(
    items: impl Iterator<Item = T>,
    limit: usize,
) -> (Vec<T>, bool) {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let n = encoded_len(&item);
        if out.len() >= limit || (!out.is_empty() && bytes + n > PAGE_BYTES) {
            return (out, true);
        }
        bytes += n;
        out.push(item);
    }
    (out, false)
}

pub(super) fn read_op(store: &RunStore, op: Op) -> Result<Answer, RunError> {
    let mut a = Answer {
        ok: true,
        ..Answer::default()
    };
    let count = |n: Option<u64>| n.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
    match op {
        Op::Get { key } => a.doc = store.get(&key)?.as_ref().map(WireDoc::of),
        Op::List {
            prefix,
            after,
            limit,
        } => {
            // The store reads one page row by row (values count once; as hex they count
            // twice), then the page is cut again by its size as JSON.
            let rows = count(limit).min(LIST_PAGE);
            let (docs, next) =
                store.scan_prefix_page(&prefix, after.as_deref(), rows, PAGE_BYTES / 2)?;
            let (docs, cut) = page(docs.iter().map(WireDoc::of), rows);
            a.more = Some(cut || next.is_some());
            a.docs = Some(docs);
        }
        Op::Log { since, max } => {
            let want = count(max).min(LOG_PAGE);
            let commits = store.commits_page_bytes(since, want, PAGE_BYTES / 2)?;
            let (commits, _) = page(commits.iter().map(WireCommit::of), want);
            // The store cannot say whether it stopped for bytes or at the end: a page with
            // commits says more may follow (until the caller's `max`); an empty one ends.
            a.more = Some(!commits.is_empty() && commits.len() < count(max));
            a.commits = Some(commits);
        }
        Op::Head => a.head = Some(store.head()?),
        Op::Commit { .. } | Op::Release => {
            return Err(RunError::InvalidArgument("not a read".into()));
        }
    }
    Ok(a)
}
