//! Shared plumbing of the subcommands: the CLI error type, output (human or one JSON
//! object per line), wall time, random ids, and how a run's status is described.

use lease_core::Code;
use lease_core::ops::{Expectation, Head, Status, StatusView};
use lease_core::{EpochState, LeaseError, Timestamp, TimingPolicy};
use lease_run::folder::FsError;
use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// sysexits `EX_USAGE`.
pub const EX_USAGE: i32 = 64;
/// sysexits `EX_SOFTWARE`.
pub const EX_SOFTWARE: i32 = 70;

/// A failure of a subcommand: a stable code, a one-line message and the exit code.
#[derive(Debug, Clone)]
pub struct CliError {
    /// Stable machine-readable code (`RUN_NOT_FOUND`, `FENCED`, ...).
    pub code: Code,
    /// Human message, without the code prefix.
    pub message: String,
    /// Process exit code (README.md "Exit codes").
    pub exit: i32,
    /// Extra fields for the `--json` error object (e.g. who holds the run).
    pub extra: Option<Value>,
}

impl CliError {
    /// A new error with an explicit code and exit code.
    pub fn new(code: Code, exit: i32, message: impl Into<String>) -> CliError {
        CliError {
            code,
            message: message.into(),
            exit,
            extra: None,
        }
    }

    /// A new error whose exit code is the one the CLI maps its code to
    /// ([`lease_cli::exit_codes::exit_for`]).
    pub fn of(code: Code, message: impl Into<String>) -> CliError {
        CliError::new(code, lease_cli::exit_codes::exit_for(code), message)
    }

    /// A usage error (exit 64) with code `ARGUMENT_INVALID`.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::of(Code::ArgumentInvalid, message)
    }

    /// Attach extra JSON fields.
    pub fn with_extra(mut self, extra: Value) -> CliError {
        self.extra = Some(extra);
        self
    }

    /// Append a sentence to the message.
    pub fn with_hint(mut self, hint: impl AsRef<str>) -> CliError {
        self.message = format!("{}; {}", self.message, hint.as_ref());
        self
    }

    /// Print the error: `runlease: CODE: message` on stderr, and with `--json` also an
    /// error object on stdout.
    pub fn report(&self, out: &Out) {
        eprintln!("runlease: {}: {}", self.code, self.message);
        if out.json {
            out.json_line(&self.json());
        }
    }

    /// The `runlease/cli/error/1` object of this error.
    pub fn json(&self) -> Value {
        let mut v = json!({
            "schema": "runlease/cli/error/1",
            "ok": false,
            "code": self.code,
            "message": self.message,
            "exit_code": self.exit,
        });
        if let (Some(Value::Object(extra)), Value::Object(map)) = (&self.extra, &mut v) {
            for (k, x) in extra {
                map.insert(k.clone(), x.clone());
            }
        }
        v
    }
}

impl From<FsError> for CliError {
    fn from(e: FsError) -> CliError {
        CliError::of(e.code(), e.to_string())
    }
}

impl From<LeaseError> for CliError {
    fn from(e: LeaseError) -> CliError {
        CliError::of(e.code(), e.to_string())
    }
}

/// Name the run folder argument in a `RUN_ID_INVALID` error (the run id is the folder's
/// last path component, so the message alone would not say which argument was wrong).
pub fn name_folder(dir: &Path, e: impl Into<CliError>) -> CliError {
    let err: CliError = e.into();
    if err.code == Code::RunIdInvalid {
        err.with_hint(format!(
            "run folder {}: the run id is the folder's name",
            dir.display()
        ))
    } else {
        err
    }
}

impl From<lease_run::RunError> for CliError {
    fn from(e: lease_run::RunError) -> CliError {
        CliError::of(e.code(), e.to_string())
    }
}

/// Resolve `--authority` / `RUNLEASE_AUTHORITY` (unset or empty: the run folder), before
/// anything is touched. An `etcd://` address is parsed (`AUTHORITY_INVALID`, 64); in a
/// build without the `etcd` feature any address is refused by `authority_unsupported`.
pub fn resolve_authority(value: Option<&str>) -> Result<lease_run::Authority, CliError> {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Ok(lease_run::Authority::RunFolder);
    };
    #[cfg(feature = "etcd")]
    {
        lease_run::Authority::parse_etcd(v).map_err(CliError::from)
    }
    #[cfg(not(feature = "etcd"))]
    {
        Err(authority_unsupported(v))
    }
}

/// The refusal of `--authority` in a build without the `etcd` feature.
#[cfg(not(feature = "etcd"))]
pub fn authority_unsupported(value: &str) -> CliError {
    CliError::of(
        Code::AuthorityUnsupported,
        format!(
            "--authority {value:?} (or RUNLEASE_AUTHORITY): this runlease was built without etcd support; rebuild with `cargo build -p lease-cli --features etcd` (needs protoc), or unset it to use the run folder"
        ),
    )
}

/// A subcommand that works on run folders only, refused with an etcd authority (64).
pub fn folder_only(what: &str, authority: &lease_run::Authority) -> Result<(), CliError> {
    match authority.url() {
        None => Ok(()),
        Some(url) => Err(CliError::of(
            Code::AuthorityUnsupported,
            format!(
                "`runlease {what}` works on run folders only, not with --authority {url}; use `runlease status`, `verify` or `events` with it"
            ),
        )),
    }
}

/// A run's lease wherever it lives, and its local folder when there is one.
pub struct Lease {
    /// The authority of the lease (the folder itself, or etcd).
    pub auth: Arc<dyn lease_run::LeaseAuthority>,
    /// The run folder, if it exists here (for `run.json`); always present for the folder
    /// authority (then it is `auth` itself).
    pub folder: Option<Arc<lease_run::folder::RunDir>>,
}

impl Lease {
    /// The run id.
    pub fn run_id(&self) -> &lease_core::RunId {
        self.auth.run_id()
    }

    /// What `status` looks at in the folder beyond the lease, for its next step
    /// ([`FolderFacts`]); nothing when there is no folder here.
    pub fn folder_facts(&self, view: &StatusView) -> FolderFacts {
        let Some(f) = self.folder.as_ref() else {
            return FolderFacts::default();
        };
        // Whether `store/run.sqlite` exists (beneath the held root, without following a
        // symlink): a store the chain names but this folder lacks makes the next
        // `runlease run` refuse (`STORE_MISSING`) before it claims.
        let store_present = f.fs().exists(lease_core::layout::STORE_FILE).ok();
        // What the next claim or replacement would refuse before writing (its preflight,
        // the verify walk, records above the head): only when the next step would be one
        // (a free, stale or dead run), so polling a live owner stays cheap. An I/O error
        // here leaves it unknown; the claim itself reports it.
        let claim_refusal = match view.status {
            Status::Free | Status::Stale | Status::Dead => {
                lease_run::diagnosis::claim_refusal(f, view).ok().flatten()
            }
            _ => None,
        };
        // A folder `runlease run` would refuse as not a run (RUN_FOLDER_FOREIGN): its next
        // step is `runlease init`, not a claim that would be refused.
        let adoption_refusal = match view.status {
            Status::Free => lease_run::diagnosis::adoption_refusal(f),
            _ => None,
        };
        // The head's cutoff, due but never written (a crash between a release's,
        // takeover's or retirement's epoch and its cutoff): shown, since the released
        // owner's acknowledged events read `pending` until the next change of owner
        // finalizes it (issue #28). One existence check, where the lease lives.
        let open_cutoff = view.head.as_ref().and_then(|h| {
            lease_core::diagnose::open_cutoff_of(&h.epoch, |g| {
                !matches!(
                    lease_core::LeaseOps::perform(
                        &*self.auth,
                        lease_core::ops::Request::Exists(lease_core::FileRef::Cutoff(g))
                    ),
                    Ok(lease_core::ops::Response::Exists(false))
                )
            })
        });
        FolderFacts {
            store_present,
            claim_refusal,
            adoption_refusal,
            open_cutoff,
        }
    }

    /// Refuse a rolled-back chain (issue #28): the head readable and no rollback evidence
    /// (`lease_run::admission::rollback_refusal`: `run.json`, the newest event ahead of the
    /// chain; `CHAIN_BROKEN` 65). For the writers that change no owner (`prune`) and the
    /// readers whose answer would otherwise be taken as authoritative (`events`, `verify`).
    pub fn refuse_rolled_back(&self) -> Result<(), CliError> {
        let view = lease_core::LeaseOps::status(&*self.auth, wall_now()?, false)?;
        let run_json = match &self.folder {
            Some(f) => Some(lease_run::admission::read_run_json(f)?),
            None => None,
        };
        let folder = match (&self.folder, &run_json) {
            (Some(dir), Some(run_json)) => Some(lease_run::admission::Folder {
                dir,
                run_json,
                store_root: None,
            }),
            _ => None,
        };
        lease_run::admission::rollback_refusal(&*self.auth, folder, &view)?;
        Ok(())
    }

    /// [`run_status_json`] of the folder, `null` when there is no folder here.
    pub fn run_status(&self) -> Value {
        self.folder
            .as_ref()
            .map_or(Value::Null, |f| run_status_json(f))
    }
}

/// What `status` knows of the run folder beyond the lease, for its next step.
#[derive(Debug, Clone, Default)]
pub struct FolderFacts {
    /// Whether `store/run.sqlite` exists (`None`: no folder here, or not looked at).
    pub store_present: Option<bool>,
    /// What the next claim would refuse before writing (`lease_run::diagnosis::claim_refusal`).
    pub claim_refusal: Option<(lease_core::Code, String)>,
    /// What `runlease run` would refuse of the folder itself (`RUN_FOLDER_FOREIGN`).
    pub adoption_refusal: Option<String>,
    /// The head's cutoff, due but never written (`None`: none open, or not looked at).
    pub open_cutoff: Option<lease_core::diagnose::OpenCutoff>,
}

/// Deadlines of the CLI's etcd calls (`lease_run::authority::EtcdLease::options` of this
/// step): an operation ends by 5 s, one attempt of one call by 1 s.
#[cfg(feature = "etcd")]
pub const ETCD_STEP: std::time::Duration = std::time::Duration::from_secs(10);

/// Open the lease of the run at `dir`. The folder authority needs the folder
/// (`RUN_NOT_FOUND`, 64); with etcd the run id is the folder's name and the folder is
/// optional (opened when it exists, for `run.json`). `folder` is a folder already opened
/// (e.g. with the owner lock's liveness), if any.
pub fn open_lease(
    dir: &Path,
    authority: &lease_run::Authority,
    folder: Option<lease_run::folder::RunDir>,
) -> Result<Lease, CliError> {
    match authority {
        lease_run::Authority::RunFolder => {
            let run = Arc::new(match folder {
                Some(f) => f,
                None => open_run(dir)?,
            });
            Ok(Lease {
                auth: Arc::new(lease_run::FolderAuthority(run.clone())),
                folder: Some(run),
            })
        }
        #[cfg(feature = "etcd")]
        lease_run::Authority::Etcd(addr) => {
            let run_id = lease_run::folder::run_id_of(dir).map_err(|e| name_folder(dir, e))?;
            let folder = folder.or_else(|| lease_run::folder::RunDir::open(dir).ok());
            let auth = lease_run::authority::EtcdLease::connect(
                addr,
                run_id,
                lease_run::authority::EtcdLease::options(ETCD_STEP, ETCD_STEP),
            )?;
            Ok(Lease {
                auth: Arc::new(auth),
                folder: folder.map(Arc::new),
            })
        }
        #[allow(unreachable_patterns)]
        _ => Err(CliError::of(
            Code::AuthorityUnsupported,
            "this authority is not supported by this build",
        )),
    }
}

/// Open an existing run folder (`RUN_NOT_FOUND`, 64, if missing; never created).
pub fn open_run(dir: &Path) -> Result<lease_run::folder::RunDir, CliError> {
    lease_run::folder::RunDir::open(dir).map_err(|e| name_folder(dir, e))
}

/// Make `dir` a run or open it (`runlease run`, `runlease init`): a missing or empty
/// folder, or a run; any other folder only when `explicit` (`RUN_FOLDER_FOREIGN`, 64).
/// Everything is judged before anything is written (`RUN_NOT_OWNED`, 77).
pub fn init_run(dir: &Path, explicit: bool) -> Result<lease_run::folder::Initialized, CliError> {
    lease_run::folder::RunDir::init(dir, explicit).map_err(|e| name_folder(dir, e))
}

/// Where output goes: human text, or one JSON object per line (`--json`).
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// `--json` was given.
    pub json: bool,
    /// `--quiet`: no progress or informational lines on stderr.
    pub quiet: bool,
}

/// Whether a terminal could act on `c` instead of showing it: control characters (C0 and
/// C1, including ESC of ANSI sequences, CR and LF inside a line; tab is kept) and the
/// bidirectional controls that reorder what is shown (U+061C, U+200E/F, U+202A–U+202E,
/// U+2066–U+2069).
pub(crate) fn terminal_unsafe(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character a terminal would interpret ([`terminal_unsafe`]) written
/// readably: LF as `\n`, CR as `\r`, any other as `\u{…}` (its code point in hex). Human
/// output shows text from records (a `run.json` detail, an event payload) and paths, and
/// anyone who can write the run folder chooses that text. A suggested command never needs
/// this: it is written with [`crate::diagnosis::Quoting::Terminal`], which leaves no such
/// character in it. JSON output has its own escapes ([`json_text`]).
pub fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(terminal_unsafe) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if terminal_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether `--json` output writes `c` as a `\uXXXX` escape although JSON allows it raw:
/// DEL and the C1 controls (U+007F–U+009F; serde_json already escapes C0), the
/// bidirectional controls a terminal or an editor reorders text by (U+061C, U+200E/F,
/// U+202A–U+202E, U+2066–U+2069) and the line and paragraph separators (U+2028/9), so a
/// consumer that shows or logs a line sees the escape, never the effect.
fn json_escaped(c: char) -> bool {
    matches!(
        c,
        '\u{7f}'..='\u{9f}'
            | '\u{061c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// serde_json's compact output, with [`json_escaped`] characters as `\uXXXX` too.
struct SafeJson;

impl serde_json::ser::Formatter for SafeJson {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if json_escaped(c) {
                w.write_all(&fragment.as_bytes()[start..i])?;
                // Every such character is in the Basic Multilingual Plane: one escape.
                write!(w, "\\u{:04x}", u32::from(c))?;
                start = i + c.len_utf8();
            }
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

/// `v` as the one line `--json` prints (compact, without the LF): serde_json's text, with
/// DEL, C1 controls, bidi controls and U+2028/9 escaped as well ([`json_escaped`]). The
/// same value as serde_json's own text, parsed back.
pub fn json_text(v: &Value) -> String {
    let mut buf = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, SafeJson);
    // Serializing a `Value` into memory cannot fail (its keys are strings).
    let _ = serde::Serialize::serialize(v, &mut ser);
    // Only whole UTF-8 characters are written, and escapes are ASCII.
    String::from_utf8(buf).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Out {
    /// Write one line to stdout. Returns `false` when stdout is gone (a closed pipe), so
    /// loops like `events --follow` can stop. Human lines go through [`terminal_safe`].
    pub fn line(&self, s: &str) -> bool {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{}", terminal_safe(s))
            .and_then(|()| o.flush())
            .is_ok()
    }

    /// Write one compact JSON object as one line to stdout ([`json_text`]: control and
    /// bidi characters in strings as `\u` escapes).
    pub fn json_line(&self, v: &Value) -> bool {
        let mut o = std::io::stdout().lock();
        writeln!(o, "{}", json_text(v))
            .and_then(|()| o.flush())
            .is_ok()
    }

    /// An informational line on stderr (suppressed by `--quiet`).
    pub fn info(&self, s: &str) {
        if !self.quiet {
            eprintln!("runlease: {s}");
        }
    }
}

/// The observer's wall clock (`CLOCK_REALTIME`) as a protocol timestamp.
pub fn wall_now() -> Result<Timestamp, CliError> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CliError::of(Code::ClockInvalid, "the wall clock is before 1970"))?
        .as_millis();
    u64::try_from(ms)
        .ok()
        .and_then(Timestamp::from_unix_millis)
        .ok_or_else(|| CliError::of(Code::ClockInvalid, "the wall clock is past 9999"))
}

/// A fresh random owner id for `takeover` and `retire`: lease-run's
/// [`lease_run::new_owner_id`], the one form (`run-<32 hex>`) `runlease run` gets too.
pub fn new_owner_id() -> Result<lease_core::Identity, CliError> {
    lease_run::new_owner_id().map_err(CliError::from)
}

/// An identity naming this CLI process for records it writes as a maintainer (prune).
pub fn cli_identity(what: &str) -> lease_core::Identity {
    let host = lease_run::folder::this_holder()
        .map(|h| h.host.to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    lease_core::Identity::new(format!("runlease-{what}@{host}:{}", std::process::id()))
        .unwrap_or_else(|_| {
            lease_core::Identity::new(format!("runlease-{what}")).expect("static identity")
        })
}

/// [`human_ms`] of a [`Duration`](std::time::Duration) (saturating).
pub fn human_duration(d: std::time::Duration) -> String {
    human_ms(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Human form of a duration in ms: `850 ms`, `1.2 s`, `3 min 5 s`.
pub fn human_ms(ms: i64) -> String {
    let neg = ms < 0;
    let a = ms.unsigned_abs();
    let s = if a < 1000 {
        format!("{a} ms")
    } else if a < 60_000 {
        format!("{:.1} s", a as f64 / 1000.0)
    } else if a < 3_600_000 {
        format!("{} min {} s", a / 60_000, (a % 60_000) / 1000)
    } else {
        format!("{} h {} min", a / 3_600_000, (a % 3_600_000) / 60_000)
    };
    if neg {
        format!("-{s} (in the future)")
    } else {
        s
    }
}

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

/// Name of an epoch state.
pub fn epoch_state_name(s: EpochState) -> &'static str {
    match s {
        EpochState::Active => "active",
        EpochState::Released => "released",
        EpochState::Retired => "retired",
    }
}

/// A path as one word of a command suggested in human text (to be pasted into a shell:
/// [`shell_path_as`] with [`Quoting::Terminal`](crate::diagnosis::Quoting::Terminal)).
pub fn shell_path(p: &Path) -> String {
    shell_path_as(p, crate::diagnosis::Quoting::Terminal)
}

/// A path as one word of a suggested command, quoted as `q` says
/// ([`crate::diagnosis::quote_word`]). A relative path starting with `-` is written `./-…`
/// (the same folder), because in prose no `--` stands before it; the argument vectors
/// ([`crate::diagnosis::next_argv`]) put `--` there instead and keep the path as given.
pub fn shell_path_as(p: &Path, q: crate::diagnosis::Quoting) -> String {
    let s = p.display().to_string();
    let s = if s.starts_with('-') {
        format!("./{s}")
    } else {
        s
    };
    crate::diagnosis::quote_word(&s, q)
}

/// The next step `status` prints: lease-core's [`next_step`](lease_core::diagnose::next_step)
/// for the view and `run.json` (a free run the next `runlease run` would refuse needs
/// doctor first), worded as a command.
pub fn status_next_step(
    view: &StatusView,
    dir: &Path,
    run_status: &Value,
    folder: &FolderFacts,
) -> String {
    crate::diagnosis::render_next_as(
        &status_next(view, run_status, folder),
        dir,
        None,
        crate::diagnosis::Quoting::Terminal,
    )
}

/// lease-core's one next step for what `status` read (`folder`: [`Lease::folder_facts`]).
fn status_next(
    view: &StatusView,
    run_status: &Value,
    folder: &FolderFacts,
) -> lease_core::diagnose::Next {
    let mut facts = lease_core::diagnose::Facts::of_view(view.clone());
    facts.run_json = crate::diagnosis::run_json_facts(run_status);
    facts.store_present = folder.store_present;
    facts.claim_refusal = folder.claim_refusal.clone();
    facts.adoption_refusal = folder.adoption_refusal.clone();
    lease_core::diagnose::next_step(&facts)
}

/// What `run.json` says (written by `runlease run` through lease-run: `running`, `paused`,
/// `done`, `failed` and the writer's generation), as the `run_status` JSON value: `null`
/// when there is none; `status: "invalid"` with the error (naming the file) as `detail`
/// when it cannot be read or decoded (reported, never repaired).
pub fn run_status_json(run: &lease_run::folder::RunDir) -> Value {
    match lease_run::diagnosis::read_run_json(run) {
        Ok(None) => Value::Null,
        Ok(Some(r)) => json!({
            "status": match r.status {
                lease_core::RunState::Running => "running",
                lease_core::RunState::Paused => "paused",
                lease_core::RunState::Done => "done",
                lease_core::RunState::Failed => "failed",
            },
            "generation": r.generation.get(),
            "detail": r.detail,
            "sealed_sequence": r.sealed_sequence,
            "updated_at": r.updated_at.to_string(),
        }),
        Err(detail) => json!({"status": "invalid", "generation": null, "detail": detail,
                              "sealed_sequence": null, "updated_at": null}),
    }
}

/// One human line for [`run_status_json`]'s value (`None` when there is no `run.json`).
pub fn run_status_human(v: &Value) -> Option<String> {
    let st = v.get("status")?.as_str()?;
    let mut line = st.to_string();
    if let Some(g) = v["generation"].as_u64() {
        line.push_str(&format!(" (generation {g}"));
        if let Some(seq) = v["sealed_sequence"].as_u64() {
            line.push_str(&format!(", store sealed at {seq}"));
        }
        line.push(')');
    }
    if let Some(d) = v["detail"].as_str() {
        line.push_str(&format!(": {d}"));
    }
    Some(line)
}

/// The status of one run as a JSON object (schema `runlease/cli/status/1`); `run_status`
/// is [`run_status_json`]'s value.
/// `authority` is the `--authority` URL when the lease is not in the run folder (it goes
/// into `next_step_argv`).
pub fn status_json(
    dir: &Path,
    run_id: &str,
    view: &StatusView,
    run_status: Value,
    folder: &FolderFacts,
    authority: Option<&str>,
) -> Value {
    let head = view.head.as_ref();
    let active = head.is_some_and(Head::is_active);
    let expect = head.filter(|h| h.is_active()).map(Expectation::of);
    let next = status_next(view, &run_status, folder);
    let (liveness, dead) = match &view.liveness {
        None => (Value::Null, Value::Null),
        Some(Ok(())) => (json!("definitely dead"), json!(true)),
        Some(Err(why)) => (json!(why), json!(false)),
    };
    let error = match &view.status {
        Status::Invalid(e) => {
            json!({"code": e.code(), "message": e.to_string()})
        }
        _ => Value::Null,
    };
    json!({
        "schema": "runlease/cli/status/1",
        "run": dir.display().to_string(),
        "run_id": run_id,
        "state": view.status.name(),
        "generation": head.map(|h| h.generation().get()),
        "epoch_state": head.map(|h| epoch_state_name(h.epoch.state)),
        "owner_id": head.map(|h| h.epoch.owner_id.to_string()),
        "host": head.map(|h| h.epoch.holder.host.to_string()),
        "boot_id": head.map(|h| h.epoch.holder.boot_id.to_string()),
        "pid": head.map(|h| h.epoch.holder.pid),
        "since": head.map(|h| h.epoch.claimed_at.to_string()),
        "heartbeat_at": head.filter(|_| active).map(|h| h.heartbeat_at().to_string()),
        "heartbeat_age_ms": view.judged_age_ms(),
        "heartbeat_age_clock": age_clock(view),
        "heartbeat_count": head.filter(|_| active).map(Head::heartbeat_count),
        "heartbeat_torn": head.filter(|_| active).map(|h| h.torn_beat.is_some()),
        "policy": head.map(|h| policy_json(&h.epoch.policy)),
        "dead": dead,
        "liveness": liveness,
        "expect_owner": expect.as_ref().map(|e| e.owner_id.to_string()),
        "expect_heartbeat": expect.as_ref().map(|e| e.heartbeat_at.to_string()),
        "expect_generation": expect.as_ref().and_then(|e| e.generation).map(|g| g.get()),
        "expect_count": expect.as_ref().and_then(|e| e.heartbeat_count),
        "next_step": crate::diagnosis::render_next_as(&next, dir, authority, crate::diagnosis::Quoting::Sh),
        "next_step_argv": crate::diagnosis::next_argv(&next, dir, authority),
        "error": error,
        "run_status": run_status,
        "open_cutoff": folder.open_cutoff.as_ref().map(|o| json!({
            "retired": o.retired.get(),
            "by": o.by.get(),
            "file": lease_core::FileRef::Cutoff(o.retired).path(),
        })),
    })
}

/// The status of one run as aligned human lines (`run_status`: [`run_status_json`]).
pub fn status_human(
    dir: &Path,
    view: &StatusView,
    run_status: &Value,
    folder: &FolderFacts,
) -> Vec<String> {
    let mut l = vec![format!("{}: {}", dir.display(), view.status.name())];
    let mut row = |k: &str, v: String| l.push(format!("  {k:<11}{v}"));
    if let Some(mut line) = run_status_human(run_status) {
        // `running` for a generation the chain has moved past (its owner crashed, or a
        // replacement died before rewriting run.json): say so (PROTOCOL §4: out of date).
        let head = view.head.as_ref().map(|h| h.generation().get());
        if let (Some("running"), Some(g), Some(h)) = (
            run_status["status"].as_str(),
            run_status["generation"].as_u64(),
            head,
        ) {
            if g < h {
                line.push_str(&format!(
                    " (out of date: the lease chain moved on to generation {h}; the state below is the chain's)"
                ));
            }
        }
        row("run.json", line);
    }
    match &view.head {
        None => {
            if let Status::Invalid(e) = &view.status {
                row("error", e.code().prefixed(e));
            } else {
                row("generation", "none (never claimed)".into());
            }
        }
        Some(h) => {
            let e = &h.epoch;
            row(
                "generation",
                format!("{} ({})", h.generation(), epoch_state_name(e.state)),
            );
            if h.is_active() {
                row("owner", e.owner_id.to_string());
                row(
                    "holder",
                    format!(
                        "host {}, pid {}, boot {}",
                        e.holder.host, e.holder.pid, e.holder.boot_id
                    ),
                );
                row("since", e.claimed_at.to_string());
                row(
                    "heartbeat",
                    format!(
                        "{} (age {}, #{})",
                        h.heartbeat_at(),
                        age_human(view),
                        h.heartbeat_count()
                    ),
                );
                if h.torn_beat.is_some() {
                    row("", crate::diagnosis::torn_beat_text(h));
                }
                row("policy", policy_human(&e.policy));
                match &view.liveness {
                    Some(Ok(())) => row("liveness", "definitely dead".into()),
                    Some(Err(why)) => row("liveness", format!("not proven dead: {why}")),
                    None => {}
                }
            } else {
                let what = match e.state {
                    EpochState::Retired => "retired a dead owner",
                    _ => "released",
                };
                row(
                    "last",
                    format!("{what} by {} at {}", e.owner_id, e.claimed_at),
                );
            }
        }
    }
    if let Some(o) = &folder.open_cutoff {
        row(
            "cutoff",
            format!(
                "open: generation {}'s cutoff ({}) was never written after generation {} replaced it (a crash in between); its events read pending until the next change of owner (the step below) finalizes it",
                o.retired,
                lease_core::FileRef::Cutoff(o.retired).path(),
                o.by
            ),
        );
    }
    row("next", status_next_step(view, dir, run_status, folder));
    l
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

/// A one-line progress message on stderr, only when stderr is a terminal.
pub struct Progress {
    tty: bool,
    shown: bool,
}

impl Progress {
    /// A progress line for `out` (shown only on a terminal, not with --quiet or --json).
    pub fn new(out: Out) -> Progress {
        Progress {
            tty: std::io::IsTerminal::is_terminal(&std::io::stderr()) && !out.quiet && !out.json,
            shown: false,
        }
    }
    /// Replace the line with `msg`.
    pub fn show(&mut self, msg: &str) {
        if self.tty {
            // Our own erase-line sequence goes out as is; the message (which names a
            // holder from the records) is made terminal-safe.
            let mut msg = terminal_safe(msg).into_owned();
            if let Some((cut, _)) = msg.char_indices().nth(200) {
                msg.truncate(cut);
            }
            raw_stderr(&format!("\r\x1b[Krunlease: {msg}"));
            self.shown = true;
        }
    }
    /// Erase the line, if one is shown.
    pub fn clear(&mut self) {
        if self.shown {
            raw_stderr("\r\x1b[K");
            self.shown = false;
        }
    }
}

/// Write to stderr as is (the progress line's own control sequence), never panicking.
fn raw_stderr(s: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(s.as_bytes());
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_are_run_and_32_hex_digits_and_differ() {
        let a = new_owner_id().unwrap().to_string();
        let b = new_owner_id().unwrap().to_string();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert!(a.starts_with("run-"), "{a}");
        assert!(
            a[4..]
                .bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{a}"
        );
    }

    #[test]
    fn json_escapes_c1_del_and_bidi_controls() {
        let v = json!({"s": "a\u{9b}31m\u{7f}\u{202e}gnp\u{2066}\u{200f}\u{61c}\n\u{1b}é中"});
        let t = json_text(&v);
        assert_eq!(
            t,
            r#"{"s":"a\u009b31m\u007f\u202egnp\u2066\u200f\u061c\n\u001bé中"}"#
        );
        assert!(t.is_ascii() || t.chars().all(|c| !json_escaped(c) && !c.is_control()));
        let back: Value = serde_json::from_str(&t).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn human_text_escapes_controls_readably() {
        assert_eq!(
            terminal_safe("a\nb\rc\u{1b}d\u{202e}e\tf"),
            "a\\nb\\rc\\u{1b}d\\u{202e}e\tf"
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_ms(850), "850 ms");
        assert_eq!(human_ms(1234), "1.2 s");
        assert_eq!(human_ms(185_000), "3 min 5 s");
        assert!(human_ms(-2000).contains("future"));
    }

    #[test]
    fn not_owned_is_77() {
        let e = CliError::from(FsError::NotOwned {
            run: "r".into(),
            path: "run.json".into(),
            uid: 1,
            mode: 0o644,
            detail: "x".into(),
        });
        // sysexits EX_NOPERM, the CLI's mapping of lease-fs's code.
        assert_eq!((e.code.as_str(), e.exit), ("RUN_NOT_OWNED", 77));
    }

    #[test]
    fn codes_are_not_repeated_in_messages() {
        let e = CliError::from(FsError::RunNotFound { path: "x".into() });
        assert_eq!(e.code, "RUN_NOT_FOUND");
        assert_eq!(e.exit, 64);
        assert!(!e.message.starts_with("RUN_NOT_FOUND"), "{}", e.message);
    }

    #[test]
    fn no_authority_is_the_run_folder() {
        for v in [None, Some("")] {
            assert_eq!(
                resolve_authority(v).unwrap(),
                lease_run::Authority::RunFolder
            );
        }
        assert!(folder_only("doctor", &lease_run::Authority::RunFolder).is_ok());
    }

    /// Without the feature (the default build) an etcd address is refused with a stable
    /// code and exit 64, naming the feature to rebuild with.
    #[cfg(not(feature = "etcd"))]
    #[test]
    fn an_etcd_authority_is_refused_without_the_feature() {
        for v in ["etcd://127.0.0.1:2379/runlease", "anything"] {
            let e = resolve_authority(Some(v)).unwrap_err();
            assert_eq!((e.code.as_str(), e.exit), ("AUTHORITY_UNSUPPORTED", 64));
            assert!(e.message.contains("--features etcd"), "{}", e.message);
            assert!(!e.message.contains('\n'));
        }
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_authorities_parse_and_bad_ones_exit_64() {
        let a = resolve_authority(Some("etcd://127.0.0.1:2379/runlease")).unwrap();
        assert_eq!(a.url().as_deref(), Some("etcd://127.0.0.1:2379/runlease"));
        let e = folder_only("list", &a).unwrap_err();
        assert_eq!((e.code.as_str(), e.exit), ("AUTHORITY_UNSUPPORTED", 64));
        let e = resolve_authority(Some("http://x:1/p")).unwrap_err();
        assert_eq!((e.code.as_str(), e.exit), ("AUTHORITY_INVALID", 64));
    }

    #[test]
    fn shell_paths_are_quoted_when_needed() {
        assert_eq!(shell_path(Path::new("./demo-run")), "./demo-run");
        assert_eq!(shell_path(Path::new("a b")), "'a b'");
        assert_eq!(shell_path(Path::new("-rf")), "./-rf");
        assert_eq!(shell_path(Path::new("$(x)")), "'$(x)'");
        assert_eq!(shell_path(Path::new("a\nb")), "$'a\\012b'");
    }
}
