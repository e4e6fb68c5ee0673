//! Reference for the Kubernetes watch stream's line splitting
//! (`kvgate_discovery::kubernetes::lines`): over the whole stream at once.

/// What splitting `stream` into newline-delimited lines of at most `max` bytes must give: the
/// complete non-blank lines (without their newline), or `None` when a line — complete, or the
/// unfinished tail — is longer than `max`.
pub fn complete_lines(stream: &[u8], max: usize) -> Option<Vec<Vec<u8>>> {
    let mut parts: Vec<&[u8]> = stream.split(|&b| b == b'\n').collect();
    let tail = parts.pop().unwrap_or_default();
    if tail.len() > max || parts.iter().any(|p| p.len() > max) {
        return None;
    }
    Some(
        parts
            .into_iter()
            .filter(|p| p.iter().any(|b| !b.is_ascii_whitespace()))
            .map(<[u8]>::to_vec)
            .collect(),
    )
}
