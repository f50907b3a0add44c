//! Calling etcd within a deadline: each attempt bounded, availability errors retried where a
//! repeat is harmless, and a write whose answer was lost reported `OUTCOME_UNKNOWN` (module
//! docs of [`crate::run`], "Deadlines").

use super::EtcdRun;
use crate::error::EtcdError;
use etcd_client::{Client, GetOptions, GetResponse};
use std::future::Future;
use std::time::{Duration, Instant};

/// Map an etcd-client error to `UNAVAILABLE` (try again: the cluster or a member is not
/// answering) or `ETCD_REFUSED` (it answered no).
pub(super) fn classify(e: etcd_client::Error, run: &str, op: &'static str, key: &str) -> EtcdError {
    use etcd_client::Error as E;
    let unavailable = match &e {
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) => true,
        // gRPC status codes by their fixed numbers (the gRPC spec), so this crate needs
        // no direct tonic dependency: CANCELLED 1, UNKNOWN 2 (tonic's transport failures),
        // DEADLINE_EXCEEDED 4, RESOURCE_EXHAUSTED 8, ABORTED 10, UNAVAILABLE 14 (etcd's
        // "no leader" / "request timed out" / "leader changed").
        E::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 8 | 10 | 14),
        _ => false,
    };
    let detail = e.to_string();
    // RESOURCE_EXHAUSTED is also etcd's "too many requests" (a retry helps); a full
    // backend says "database space exceeded" (a retry never helps).
    if detail.contains("database space exceeded") {
        return EtcdError::NoSpace {
            run: run.to_string(),
            op,
            key: key.to_string(),
            detail,
        };
    }
    if unavailable {
        EtcdError::Unavailable {
            run: run.to_string(),
            op,
            key: key.to_string(),
            detail,
        }
    } else {
        EtcdError::Refused {
            run: run.to_string(),
            op,
            key: key.to_string(),
            detail,
        }
    }
}

/// Whether the call certainly never reached a member: somewhere in the error's cause
/// chain the TCP connection was refused.
pub(super) fn never_sent(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e {
        E::GRpcStatus(s) => std::error::Error::source(s),
        E::TransportError(t) => std::error::Error::source(t),
        E::IoError(io) => Some(io),
        _ => None,
    };
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// How [`EtcdRun`]'s calls are retried after an availability error, and how they end
/// when the deadline passes (module docs, "Deadlines").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// Changes no record (a range, a keep-alive, a lease grant): retried until the
    /// deadline, then `UNAVAILABLE`.
    Read,
    /// A write that is safe to repeat (a delete, the guarded heartbeat put, the exclusive
    /// create, which tells its own earlier attempt by its bytes): retried until the
    /// deadline, then `OUTCOME_UNKNOWN` if an attempt was sent and not answered (it may
    /// have landed), else `UNAVAILABLE` (no attempt reached a member).
    Write,
    /// Best effort, not repeated once sent (a lease revoke): only a call that never
    /// reached a member is retried.
    Once,
}

/// How long one attempt of a call may wait when `remaining` is left of its operation's
/// deadline: `call_timeout`, but at most a third of what is left (and at least 100 ms),
/// so a call always gets about three attempts. A member cut off by a silent partition
/// holds an attempt routed to it until that attempt's end (nothing is refused); with a
/// heartbeat's deadline of `self_fence_after` (1.5 s in the partition harness) and the
/// 1 s default, one such attempt and a second unlucky one lapsed a healthy owner whose
/// cluster had a leader and a quorum all along (issue #31's fast-heal probe saw it).
pub(super) fn attempt_budget(call_timeout: Duration, remaining: Duration) -> Duration {
    call_timeout.min((remaining / 3).max(Duration::from_millis(100)))
}

impl EtcdRun {
    /// One etcd call with deadlines: each attempt ends by `min(deadline, now +
    /// call_timeout)`; availability errors are retried until `deadline` as `kind` says
    /// ([`Call`]).
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        deadline: Instant,
        kind: Call,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.attempts(op, key, deadline, kind, f)
            .await
            .map(|(v, _)| v)
    }

    /// A range read of `key` with `opts` (`None`: that one key, value included), retried
    /// as a read ([`Call::Read`]).
    pub(super) async fn range(
        &self,
        key: &str,
        opts: Option<GetOptions>,
        deadline: Instant,
    ) -> Result<GetResponse, EtcdError> {
        let k = key.to_string();
        self.call("range", key, deadline, Call::Read, move |mut c| {
            let (k, opts) = (k.clone(), opts.clone());
            async move { c.get(k, opts).await }
        })
        .await
    }

    /// [`Self::call`], also saying whether an attempt before the one answered was sent and
    /// not answered (so it may have taken effect): what lets an exclusive create tell its
    /// own earlier attempt ([`is_own_record`]).
    ///
    /// When the deadline passes (or a [`Call::Once`] may not be retried) after an attempt
    /// of a [`Call::Write`] was sent and not answered (a timeout, or an availability error
    /// other than a refused connection), the error is `OUTCOME_UNKNOWN`, never
    /// `UNAVAILABLE`: the write may have landed. Errors etcd answered with
    /// (`ETCD_REFUSED`, `ETCD_NOSPACE`) end the call at once, as they are.
    pub(super) async fn attempts<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        deadline: Instant,
        kind: Call,
        mut f: F,
    ) -> Result<(T, bool), EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let run = self.run_id.as_str();
        let mut last: Option<EtcdError> = None;
        // Whether an attempt so far was sent and not answered.
        let mut unanswered = false;
        let unknown = |err: EtcdError, unanswered: bool| match err {
            EtcdError::Unavailable { detail, .. } if unanswered && kind == Call::Write => {
                EtcdError::OutcomeUnknown {
                    run: run.to_string(),
                    op,
                    key: key.to_string(),
                    file: None,
                    detail,
                }
            }
            e => e,
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                let err = last.unwrap_or_else(|| EtcdError::Unavailable {
                    run: run.to_string(),
                    op,
                    key: key.to_string(),
                    detail: "the operation's deadline passed before the call".into(),
                });
                return Err(unknown(err, unanswered));
            }
            let attempt_end =
                deadline.min(now + attempt_budget(self.inner.opts.call_timeout, deadline - now));
            let answer = tokio::time::timeout_at(
                tokio::time::Instant::from_std(attempt_end),
                f(self.inner.client.clone()),
            )
            .await;
            #[cfg(feature = "test-hooks")]
            let answer = match answer {
                Ok(Ok(_)) if kind == Call::Write && self.lose_answer() => Err(()),
                other => other.map_err(|_| ()),
            };
            let (err, sent) = match answer {
                Ok(Ok(v)) => return Ok((v, unanswered)),
                // A request that never left (the member refused the connection: the
                // client's balancer still picks a crashed member until it notices) changed
                // nothing, whatever the call.
                Ok(Err(e)) => {
                    let sent = !never_sent(&e);
                    (classify(e, run, op, key), sent)
                }
                Err(_) => (
                    EtcdError::Unavailable {
                        run: run.to_string(),
                        op,
                        key: key.to_string(),
                        detail: format!(
                            "no answer within {} ms",
                            attempt_end.saturating_duration_since(now).as_millis()
                        ),
                    },
                    true,
                ),
            };
            if !err.is_unavailable() {
                return Err(err);
            }
            unanswered |= sent;
            if kind == Call::Once && sent {
                return Err(unknown(err, unanswered));
            }
            last = Some(err);
            let pause = tokio::time::Instant::from_std(
                deadline.min(Instant::now() + Duration::from_millis(50)),
            );
            tokio::time::sleep_until(pause).await;
        }
    }

    /// Test hook (feature `test-hooks`): make the next `n` answered attempts of writes
    /// look unanswered, as if each answer was lost on its way back: the write took effect,
    /// the client times out and retries. How the tests show a retry adopting its own
    /// earlier attempt, and a write ending `OUTCOME_UNKNOWN`, deterministically.
    #[cfg(feature = "test-hooks")]
    pub fn lose_write_answers(&self, n: u32) {
        self.lost_answers
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn lose_answer(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.lost_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::{Client, ConnectOptions};

    #[test]
    fn an_attempt_gets_at_most_a_third_of_what_is_left() {
        let ms = Duration::from_millis;
        // An ordinary operation (10 s): the call timeout.
        assert_eq!(attempt_budget(ms(1000), ms(10_000)), ms(1000));
        // A heartbeat with 1.5 s to its self-fence deadline: three attempts fit.
        assert_eq!(attempt_budget(ms(1000), ms(1500)), ms(500));
        // Never below 100 ms (then the deadline itself ends the attempt).
        assert_eq!(attempt_budget(ms(1000), ms(30)), ms(100));
    }

    #[test]
    fn a_refused_connection_is_recognized_as_never_sent() {
        // A port nothing listens on: the call fails before any byte of it is sent, which is
        // what allows even a transaction to be retried on another member.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(async {
            let mut c = Client::connect(
                [format!("http://127.0.0.1:{port}")],
                Some(ConnectOptions::new().with_connect_timeout(Duration::from_millis(500))),
            )
            .await?;
            c.get("k", None).await.map(|_| ())
        });
        let err = err.unwrap_err();
        assert!(never_sent(&err), "{err:?}");
        assert!(classify(err, "r", "range", "k").is_unavailable());
    }
}
