//! Opening a run: `--authority` resolved, the run's lease wherever it lives ([`Lease`]:
//! the run folder, or etcd), the folder opened or made a run, the rollback check of the
//! readers and writers that change no owner.

use crate::error::{CliError, name_folder};
use crate::stamps::wall_now;
use lease_core::Code;
use std::path::Path;
use std::sync::Arc;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
