//! Small text helpers shared by the conductor's modules.

/// At most `max` characters of `s`.
pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}
