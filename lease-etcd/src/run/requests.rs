//! lease-core's requests as etcd calls: reads and listings, the guarded heartbeat put, the
//! engine store's guarded create and replace, and its range reads.

use super::call::Call;
use super::{EtcdRun, fenced};
use crate::error::EtcdError;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use lease_core::ops::{Request, Response};
use lease_core::{Dir, FileRef, Generation, LeaseError, Sequence};
use std::time::Instant;

/// The most store records one etcd range read asks for ([`EtcdRun`]'s `read_records`):
/// with records of at most 1 MiB, an answer is at most this many MiB.
pub(super) const RECORDS_PER_RANGE: u32 = 32;

/// The largest range answer accepted when reading store records (etcd-client's default
/// decoding limit is 4 MiB): [`RECORDS_PER_RANGE`] records of 1 MiB and their keys.
pub(super) const RANGE_ANSWER_BYTES: usize = 40 << 20;

impl EtcdRun {
    pub(super) async fn get_one(
        &self,
        key: String,
        keys_only: bool,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, EtcdError> {
        let opts = keys_only.then(|| GetOptions::new().with_keys_only());
        let resp = self.range(&key, opts, deadline).await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The entries of `dir` whose names parse, from a keys-only range read.
    pub(super) async fn list(
        &self,
        dir: Dir,
        deadline: Instant,
    ) -> Result<Vec<FileRef>, EtcdError> {
        let p = format!("{}{}/", self.base, dir.path());
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let resp = self.range(&p, Some(opts), deadline).await?;
        // Names are parsed exactly as on disk: anything that is not a name the layout
        // produces (deeper keys, strays) is not a listed entry.
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().strip_prefix(p.as_bytes()))
            .filter_map(|n| std::str::from_utf8(n).ok())
            .filter_map(|n| dir.parse_name(n))
            .collect())
    }

    /// Perform one request of a lease-core operation, finishing by `deadline`.
    pub(super) async fn perform_async(
        &self,
        req: Request,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        match req {
            Request::List(dir) => Ok(Response::Listing(self.list(dir, deadline).await?)),
            // Counted from a keys-only listing: over etcd the names come in one response
            // anyway (the run folder streams them).
            Request::CountEvents => {
                let (mut count, mut highest) = (0u64, 0u64);
                for f in self.list(Dir::Events, deadline).await? {
                    if let FileRef::Event(s) = f {
                        count += 1;
                        highest = highest.max(s.get());
                    }
                }
                Ok(Response::EventCount { count, highest })
            }
            Request::Read(f) => Ok(Response::Content(
                self.get_one(self.key(f), false, deadline).await?,
            )),
            Request::Exists(f) => Ok(Response::Exists(
                self.get_one(self.key(f), true, deadline).await?.is_some(),
            )),
            Request::CreateExclusive(f, bytes) => self.create(f, bytes, deadline).await,
            Request::CreateGuarded {
                file,
                bytes,
                generation,
            } => self.create_guarded(file, bytes, generation, deadline).await,
            Request::ReplaceGuarded {
                file,
                bytes,
                generation,
            } => {
                self.replace_guarded(file, bytes, generation, deadline)
                    .await
            }
            Request::ReadStoreRecords {
                from,
                max_count,
                max_bytes,
            } => {
                self.read_records(from, max_count, max_bytes, deadline)
                    .await
            }
            // A put is atomic and never torn: the record itself is the value, the older
            // one-record form every reader still accepts (lease_core::beat::SlotRead::Legacy).
            Request::WriteBeat {
                file: f,
                record: bytes,
                ..
            } => self.write_beat(f, bytes, deadline).await,
            Request::Remove(f, _durability) => {
                let key = self.key(f);
                let k = key.clone();
                self.call("delete", &key, deadline, Call::Write, move |mut c| {
                    let k = k.clone();
                    async move { c.delete(k, None).await }
                })
                .await
                .map_err(|e| e.about(f))?;
                Ok(Response::Done)
            }
            Request::ProbeLiveness(holder) => self.probe(&holder, deadline).await,
            // What a read returns was committed by a quorum, which is etcd's durability:
            // nothing visible can be lost to one member's power loss (PROTOCOL §7.0 SYNC).
            Request::SyncDir(_) => Ok(Response::Done),
            // This process's CLOCK_BOOTTIME (the takeover's look-to-commit window, OQ-5).
            Request::Monotonic => {
                let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
                let ns = u64::try_from(ts.tv_sec)
                    .unwrap_or(0)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0));
                Ok(Response::Monotonic(ns))
            }
        }
    }

    /// One transaction writing `key`, retried within `deadline` ([`Call::Write`]: each
    /// transaction here is safe to repeat, see its caller); also whether an attempt before
    /// the one answered was sent and not answered ([`Self::attempts`]).
    pub(super) async fn txn(
        &self,
        key: &str,
        deadline: Instant,
        txn: Txn,
    ) -> Result<(etcd_client::TxnResponse, bool), EtcdError> {
        self.attempts("txn", key, deadline, Call::Write, move |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    /// A heartbeat, as one guarded transaction, so that etcd itself refuses a deposed
    /// generation's beat (issue #31): the record of generation `g`'s heartbeat is put only
    /// while (1) no epoch above `g` exists, a range compare over every epoch key from
    /// `g + 1` on (prune removes epochs, so a point check on `g + 1` would not do), and (2)
    /// `g`'s liveness key exists, that is its owner's etcd lease is alive. The keep-alive
    /// before the heartbeat ([`LeaseOps::heartbeat_within`]'s `before_heartbeat`) checks
    /// (2) one request earlier; an owner paused between the two would otherwise land its
    /// beat after its lease expired and a taker created `g + 1`. Refused, nothing is
    /// written and the heartbeat is `FENCED` (never `Done`: a heartbeat that succeeded
    /// would extend the owner's self-fence deadline). Retried on unavailability: the put is
    /// idempotent, and a retry the guard refuses after an attempt that landed only answers
    /// `FENCED` for a beat nobody may act on any more.
    pub(super) async fn write_beat(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let key = self.key(f);
        let FileRef::Beat(g) = f else {
            return Err(EtcdError::Lease(LeaseError::ProtocolViolation {
                detail: format!("a heartbeat write to {key}, which is not a heartbeat file"),
            }));
        };
        let mut compares = vec![Compare::version(self.live_key(g), CompareOp::Greater, 0)];
        compares.extend(self.no_epoch_above(g));
        let txn = Txn::new()
            .when(compares)
            .and_then(vec![TxnOp::put(key.clone(), bytes, None)]);
        let (resp, _) = self
            .txn(&key, deadline, txn)
            .await
            .map_err(|e| e.about(f))?;
        if resp.succeeded() {
            return Ok(Response::Done);
        }
        Err(fenced(
            &self.run_id,
            g,
            "etcd refused its heartbeat: a newer epoch exists or its etcd lease is gone",
        ))
    }

    /// The compare "no epoch above `g` exists": `create_revision = 0` over every epoch key
    /// from `g + 1` on, one range compare (prune removes epochs, so a point compare on
    /// `g + 1` could pass after a compaction). `None` when `g` is the last generation.
    pub(super) fn no_epoch_above(&self, g: Generation) -> Option<Compare> {
        let from = Generation::new(g.get().checked_add(1)?)?;
        // Epoch keys are `<base>lease/epochs/<20 digits>.json`: the range ends at the
        // first key after that folder (`/` + 1 = `0`).
        let end = format!("{}0", self.key_dir(Dir::Epochs).trim_end_matches('/'));
        Some(
            Compare::create_revision(self.key(FileRef::Epoch(from)), CompareOp::Equal, 0)
                .with_range(end),
        )
    }

    /// The engine's guard (PROTOCOL §18.2, issue #32): create `f` only if it is absent and
    /// no epoch above `g` exists, as one transaction (the exclusive create's,
    /// [`Self::create_txn`]), so etcd itself refuses a deposed generation's store record,
    /// snapshot chunk or manifest. Its else branch reads `f`: present, the answer is
    /// `AlreadyExists` (or `Created` when it holds exactly these bytes after an attempt of
    /// this call went unanswered: the attempt landed, as for an exclusive create,
    /// [`is_own_record`](super::create::is_own_record)); absent, the failed compare was the
    /// epochs': `Superseded`. Retrying the same transaction is safe: at most one value ever
    /// occupies `f`, and once an epoch above `g` exists one always does (prune keeps the
    /// head), so a late attempt can only find the key taken or be refused.
    pub(super) async fn create_guarded(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        g: Generation,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let guards = self.no_epoch_above(g).into_iter().collect();
        let answer = self
            .create_txn(f, bytes, guards, Vec::new(), deadline)
            .await?;
        Ok(answer.unwrap_or(Response::Superseded))
    }

    /// A put of `f` guarded by "no epoch above `g`" (PROTOCOL §18: `run.json` in the
    /// engine), one transaction: `Done`, or `Superseded` with nothing written. Retried on
    /// unavailability: the put is idempotent, and once an epoch above `g` exists every
    /// attempt is refused.
    pub(super) async fn replace_guarded(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        g: Generation,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let key = self.key(f);
        let txn = Txn::new()
            .when(self.no_epoch_above(g).into_iter().collect::<Vec<_>>())
            .and_then(vec![TxnOp::put(key.clone(), bytes, None)]);
        let (resp, _) = self
            .txn(&key, deadline, txn)
            .await
            .map_err(|e| e.about(f))?;
        Ok(if resp.succeeded() {
            Response::Done
        } else {
            Response::Superseded
        })
    }

    /// The store's records from `from` on, in key order (20-digit names sort as
    /// numbers): at most `max_count` of them, cut after the record that reaches
    /// `max_bytes`. Names that do not parse are skipped, as a listing skips them.
    ///
    /// Each etcd range read asks for at most [`RECORDS_PER_RANGE`] keys and accepts an
    /// answer of up to [`RANGE_ANSWER_BYTES`]: a record is at most 1 MiB, so one answer is
    /// bounded whatever the records hold (a range of 256 large records was a 15 MB answer,
    /// above etcd-client's default 4 MiB decoding limit, and a new host could not catch
    /// up: found by the engine store bench). Reads go on from the last key until the
    /// count or the bytes are reached or the folder ends.
    pub(super) async fn read_records(
        &self,
        from: Sequence,
        max_count: u32,
        max_bytes: u64,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let dir = self.key_dir(Dir::StoreLog);
        // The first key after the folder (`/` + 1 = `0`).
        let end = format!("{}0", dir.trim_end_matches('/'));
        let mut out: Vec<(Sequence, Vec<u8>)> = Vec::new();
        let mut bytes = 0u64;
        let mut next = from;
        let want = max_count.max(1) as usize;
        loop {
            let start = self.key(FileRef::StoreRecord(next));
            let limit = RECORDS_PER_RANGE.min((want - out.len()) as u32);
            let (k, e) = (start.clone(), end.clone());
            let resp = self
                .call("range", &start, deadline, Call::Read, move |c| {
                    let (k, e) = (k.clone(), e.clone());
                    async move {
                        c.kv_client()
                            .max_decoding_message_size(RANGE_ANSWER_BYTES)
                            .get(
                                k,
                                Some(GetOptions::new().with_range(e).with_limit(i64::from(limit))),
                            )
                            .await
                    }
                })
                .await?;
            let got = resp.kvs().len();
            let mut last = None;
            for kv in resp.kvs() {
                let name = kv
                    .key()
                    .strip_prefix(dir.as_bytes())
                    .and_then(|n| std::str::from_utf8(n).ok());
                if let Some(FileRef::StoreRecord(s)) =
                    name.and_then(|n| Dir::StoreLog.parse_name(n))
                {
                    last = Some(s);
                    if out.len() < want && (out.is_empty() || bytes < max_bytes) {
                        bytes = bytes.saturating_add(kv.value().len() as u64);
                        out.push((s, kv.value().to_vec()));
                    }
                }
            }
            let full = out.len() >= want || bytes >= max_bytes;
            match last.and_then(|s| Sequence::new(s.get().checked_add(1)?)) {
                Some(n) if !full && got >= limit as usize => next = n,
                _ => break,
            }
        }
        Ok(Response::Records(out))
    }
}
