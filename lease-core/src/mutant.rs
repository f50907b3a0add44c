//! Planted protocol mutants (issue #30, `cargo xtask mutants`): the switch each planted
//! mutant is guarded by, `if mutant("name") { ... }` at the exact spot it breaks.
//!
//! Without the `mutants` feature (every normal and release build) [`mutant`] is a constant
//! `false` the compiler removes. With it (`cargo xtask mutants`, and CI's `--all-features`
//! builds) it reads `RUNLEASE_MUTANT` only: with the variable unset nothing changes, so an
//! `--all-features` build behaves as a normal one. The list of mutants, the rule each
//! breaks and the checks that must kill it is `xtask/src/mutants.rs`.

/// Is the planted mutant `name` switched on (`RUNLEASE_MUTANT=name`, `mutants` feature)?
#[cfg(feature = "mutants")]
// lease-core takes no configuration from the environment (clippy.toml); this test-only
// switch, compiled only with the `mutants` feature, is the one exception.
#[expect(
    clippy::disallowed_methods,
    reason = "feature-gated test-only mutant switch"
)]
pub fn mutant(name: &str) -> bool {
    std::env::var("RUNLEASE_MUTANT").as_deref() == Ok(name)
}

/// Is the planted mutant `name` switched on? Never, without the `mutants` feature.
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub fn mutant(_name: &str) -> bool {
    false
}
