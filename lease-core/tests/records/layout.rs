//! Layout: file names parse back to their files and no name read from disk escapes its folder.

use crate::cases;
use crate::record_strategies::{entry_name, file_ref};
use lease_core::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(cases(256))]

    /// Layout: a directory entry is accepted only if it is exactly the name the layout would
    /// write for the parsed file, so no name read from disk can escape its folder.
    #[test]
    fn layout_accepts_only_names_it_would_write(name in entry_name()) {
        for dir in Dir::ALL {
            if let Some(f) = dir.parse_name(&name) {
                prop_assert_eq!(f.file_name(), name.clone());
                prop_assert_eq!(f.dir(), Some(dir));
                prop_assert!(!name.contains('/') && !name.contains('\\'), "{:?}", name);
                prop_assert!(!name.starts_with('.'), "{:?}", name);
                prop_assert!(name.is_ascii(), "{:?}", name);
                prop_assert_eq!(f.path(), format!("{}/{}", dir.path(), name));
            }
        }
    }

    /// Layout: every file the protocol names is recognised in its own folder.
    #[test]
    fn layout_names_of_every_file_parse_back(f in file_ref()) {
        let dir = f.dir().ok_or_else(|| TestCaseError::fail("no folder"))?;
        prop_assert_eq!(dir.parse_name(&f.file_name()), Some(f));
    }
}
