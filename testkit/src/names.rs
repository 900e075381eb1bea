//! Names for topics and groups that no other test or run uses, so tests run in parallel on
//! one broker and never see each other's records.

/// `{prefix}-{random}`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_differ_and_keep_their_prefix() {
        let (a, b) = (super::unique("src"), super::unique("src"));
        assert_ne!(a, b);
        assert!(a.starts_with("src-"));
    }
}
