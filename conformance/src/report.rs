//! What a run of the suite found: each check's outcome per architecture, as data (serialised
//! for `hookscope conformance --json`) and as a table.

use std::fmt;

use serde::{Serialize, Serializer};

/// How one check ended for one architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The check ran and held.
    Pass,
    /// The check ran and found a difference or an error (the detail says which).
    Fail,
    /// The check does not apply to this architecture (e.g. no recurrent state to carry).
    NotApplicable,
    /// The check could not run here (the detail says why).
    Skipped,
}

impl Status {
    /// The name the table and the JSON report show: `pass`, `fail`, `n/a` or `skipped`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::NotApplicable => "n/a",
            Status::Skipped => "skipped",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// One check's outcome for one architecture.
#[derive(Debug, Clone, Serialize)]
pub struct CheckOutcome {
    /// The check's name.
    pub check: &'static str,
    /// How it ended.
    pub status: Status,
    /// For a failure: the first differing value, or the error; for a skip, the reason.
    pub detail: String,
}

/// Every check's outcome for one architecture.
#[derive(Debug, Clone, Serialize)]
pub struct ArchReport {
    /// The architecture's registered name.
    pub arch: &'static str,
    /// The outcomes, in suite order.
    pub checks: Vec<CheckOutcome>,
}

impl ArchReport {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The outcome of the check named `check`, if it was run.
    pub fn check(&self, check: &str) -> Option<&CheckOutcome> {
        self.checks.iter().find(|c| c.check == check)
    }
}

/// A Markdown-style table: architecture × check, then every detail.
pub fn table(reports: &[ArchReport]) -> String {
    let Some(first) = reports.first() else {
        return "no architectures registered\n".into();
    };
    let mut out = format!(
        "| arch | {} |\n|---|{}\n",
        first
            .checks
            .iter()
            .map(|c| c.check)
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(first.checks.len())
    );
    for report in reports {
        let cells: Vec<&str> = report.checks.iter().map(|c| c.status.name()).collect();
        out += &format!("| {} | {} |\n", report.arch, cells.join(" | "));
    }
    for report in reports {
        for check in report.checks.iter().filter(|c| !c.detail.is_empty()) {
            out += &format!(
                "\n{} / {} {}: {}",
                report.arch, check.check, check.status, check.detail
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(status: Status) -> ArchReport {
        ArchReport {
            arch: "tiny",
            checks: vec![CheckOutcome {
                check: "loads",
                status,
                detail: String::new(),
            }],
        }
    }

    #[test]
    fn statuses_print_and_serialise_under_their_report_names() {
        let all = [
            Status::Pass,
            Status::Fail,
            Status::NotApplicable,
            Status::Skipped,
        ];
        let json: Vec<String> = all
            .iter()
            .map(|s| serde_json::to_string(s).unwrap())
            .collect();
        assert_eq!(json, ["\"pass\"", "\"fail\"", "\"n/a\"", "\"skipped\""]);
        let shown: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["pass", "fail", "n/a", "skipped"]);
    }

    #[test]
    fn only_a_failure_fails_a_report() {
        assert!(report(Status::Pass).passed());
        assert!(report(Status::NotApplicable).passed());
        assert!(report(Status::Skipped).passed());
        assert!(!report(Status::Fail).passed());
        assert!(table(&[report(Status::Fail)]).contains("| tiny | fail |"));
    }
}
