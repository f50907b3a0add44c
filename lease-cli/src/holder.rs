//! A run's owner as refusals, `status` and `doctor` describe it: who holds the run
//! ([`held_description`]), its heartbeat's age and the clock that measured it, its timing
//! policy.

use crate::text::human_ms;
use lease_core::TimingPolicy;
use lease_core::ops::StatusView;
use serde_json::{Value, json};

/// The policy as JSON.
pub fn policy_json(p: &TimingPolicy) -> Value {
    json!({
        "heartbeat_ms": p.heartbeat_ms(),
        "self_fence_after_ms": p.self_fence_after_ms(),
        "stale_after_ms": p.stale_after_ms(),
        "heartbeat_durability": match p.heartbeat_durability() {
            lease_core::HeartbeatDurability::Local => "local",
            lease_core::HeartbeatDurability::Durable => "durable",
        },
    })
}

/// The policy in one human line.
pub fn policy_human(p: &TimingPolicy) -> String {
    format!(
        "heartbeat {} ms, self-fence after {} ms, stale after {} ms, {} heartbeats",
        p.heartbeat_ms(),
        p.self_fence_after_ms(),
        p.stale_after_ms(),
        match p.heartbeat_durability() {
            lease_core::HeartbeatDurability::Local => "local",
            lease_core::HeartbeatDurability::Durable => "durable",
        }
    )
}

/// Which clock measured [`StatusView::judged_age_ms`]: `monotonic` when the beat was
/// stamped on this host's own clock (same boot and time namespace, PROTOCOL §10), `wall`
/// otherwise; `null` without an active head.
pub fn age_clock(view: &StatusView) -> Value {
    match (view.mono_age_ms, view.age_ms) {
        (Some(_), _) => json!("monotonic"),
        (None, Some(_)) => json!("wall"),
        (None, None) => Value::Null,
    }
}

/// The judged heartbeat age for people: `1.2s`, `1.2s on this host's clock` when it was
/// measured on the monotonic clock the beat was stamped on, `?` when unknown.
pub fn age_human(view: &StatusView) -> String {
    match (view.mono_age_ms, view.judged_age_ms()) {
        (Some(_), Some(a)) => format!("{} on this host's clock", human_ms(a)),
        (_, Some(a)) => human_ms(a),
        (_, None) => "?".into(),
    }
}

/// Who holds a run, for a refusal: human text and JSON fields.
pub fn held_description(view: &StatusView) -> (String, Value) {
    let Some(h) = view.head.as_ref().filter(|h| h.is_active()) else {
        return (
            "held, but no active owner is recorded yet".into(),
            json!({"state": view.status.name()}),
        );
    };
    let e = &h.epoch;
    let age = age_human(view);
    (
        format!(
            "held by owner {} (host {}, pid {}, since {}, generation {}), last heartbeat {} (age {}, #{}), state {}",
            e.owner_id,
            e.holder.host,
            e.holder.pid,
            e.claimed_at,
            h.generation(),
            h.heartbeat_at(),
            age,
            h.heartbeat_count(),
            view.status.name()
        ),
        json!({
            "state": view.status.name(),
            "holder": {
                "owner_id": e.owner_id.to_string(),
                "host": e.holder.host.to_string(),
                "pid": e.holder.pid,
                "since": e.claimed_at.to_string(),
                "generation": h.generation().get(),
                "heartbeat_at": h.heartbeat_at().to_string(),
                "heartbeat_age_ms": view.judged_age_ms(),
                "heartbeat_age_clock": age_clock(view),
                "heartbeat_count": h.heartbeat_count(),
            }
        }),
    )
}
