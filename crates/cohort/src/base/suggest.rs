//! "Did you mean": the known name closest to one that was not found, when
//! one is close enough to be the likely intent.

/// The candidate most similar to `wanted` (Jaro–Winkler, as clap suggests
/// subcommands), if any is similar enough; ties go to the first.
pub(crate) fn closest<'a>(
    wanted: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let wanted = wanted.to_lowercase();
    let mut best: Option<(f64, &str)> = None;
    for candidate in known {
        let score = strsim::jaro_winkler(&wanted, &candidate.to_lowercase());
        if score >= 0.8 && best.is_none_or(|(b, _)| score > b) {
            best = Some((score, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// `; did you mean "x"?`, or nothing when no candidate is close.
pub(crate) fn did_you_mean<'a>(wanted: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    closest(wanted, known)
        .map(|c| format!("; did you mean {c:?}?"))
        .unwrap_or_default()
}

/// A serde error about an unknown field or variant (`unknown field `x`,
/// expected one of `a`, `b``) with the closest expected name appended to
/// that line.
pub(crate) fn serde_message(message: &str) -> String {
    let lines: Vec<String> = message
        .split('\n')
        .map(|line| {
            let Some(rest) = ["unknown field `", "unknown variant `"]
                .iter()
                .find_map(|p| line.split_once(p).map(|(_, r)| r))
            else {
                return line.to_owned();
            };
            let Some((wanted, expected)) = rest.split_once('`') else {
                return line.to_owned();
            };
            let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
            match closest(wanted, names) {
                Some(c) => format!("{line}; did you mean `{c}`?"),
                None => line.to_owned(),
            }
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestion_table() {
        let strategies = ["purge", "soft_delete", "anonymise", "exempt", "archive"];
        for (typed, expect) in [
            ("anonymize", Some("anonymise")),
            ("purg", Some("purge")),
            ("soft-delete", Some("soft_delete")),
            ("Archive", Some("archive")),
            ("shred", None),
            ("", None),
        ] {
            assert_eq!(closest(typed, strategies), expect, "{typed:?}");
        }
        assert_eq!(
            did_you_mean("sesions", ["sessions", "contacts"]),
            "; did you mean \"sessions\"?"
        );
        assert_eq!(did_you_mean("zzz", ["sessions"]), "");
    }

    #[test]
    fn serde_messages_gain_the_closest_name() {
        assert_eq!(
            serde_message("unknown field `perod`, expected one of `name`, `strategy`, `period`"),
            "unknown field `perod`, expected one of `name`, `strategy`, `period`; did you mean `period`?"
        );
        assert_eq!(
            serde_message("TOML parse error at line 3\nunknown field `anonymize`, expected `anonymise` or `subjects`\n"),
            "TOML parse error at line 3\nunknown field `anonymize`, expected `anonymise` or `subjects`; did you mean `anonymise`?\n"
        );
        assert_eq!(
            serde_message("unknown field `zzz`, expected `name`"),
            "unknown field `zzz`, expected `name`"
        );
        assert_eq!(
            serde_message("missing field `name`"),
            "missing field `name`"
        );
    }
}
