//! The decision: the fast, allocation-free result of `Policy::decide_into` (indices into the
//! deciding policy). Its explanation, with names, values and renderings, is
//! [`crate::explain::Explanation`], built from it on demand.

use crate::facts::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Selected,
    /// Eligible, but another backend came first in the preference order (`None`: nothing
    /// was selected, e.g. the backend is missing from the order that applied).
    Outranked {
        by: Option<u16>,
    },
    /// At least one rule declined every variant.
    Declined,
    /// Turned off by an environment switch (and nothing else would serve).
    Disabled,
    /// Eligible unless a probe fact answers otherwise.
    Undecided,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Selected => "selected",
            Status::Outranked { .. } => "outranked",
            Status::Declined => "declined",
            Status::Disabled => "disabled",
            Status::Undecided => "undecided",
        }
    }

    pub fn eligible(self) -> bool {
        matches!(self, Status::Selected | Status::Outranked { .. })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BackendResult {
    pub status: Status,
    /// The chosen variant (first eligible in the backend's order).
    pub variant: Option<u8>,
    /// The chosen variant's reported value (TE: flash version, fused sub-backend).
    pub value: Value,
    pub applicable: u64,
    pub declined: u64,
    pub switched: u64,
    pub undecided: u64,
}

impl Default for BackendResult {
    fn default() -> Self {
        BackendResult {
            status: Status::Declined,
            variant: None,
            value: Value::Null,
            applicable: 0,
            declined: 0,
            switched: 0,
            undecided: 0,
        }
    }
}

/// The outcome of one decision. Indices refer to the deciding [`Policy`](crate::policy::Policy).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub selected: Option<u16>,
    /// Index of the preference entry that applied.
    pub preference: Option<u16>,
    /// An undecided backend precedes the selected one: a probe answer could change the choice.
    pub pending: bool,
    pub backends: Vec<BackendResult>,
    /// Rules whose condition held, in pack order.
    pub fired: Vec<u32>,
    /// Rules whose condition is unknown until a probe answers.
    pub unknown: Vec<u32>,
    /// Scratch: values of the pack's definitions during the last decision.
    pub(crate) memo: Vec<Option<Value>>,
    /// Scratch: truth of the pack's shared conjuncts during the last decision.
    pub(crate) atoms: crate::eval::plan::AtomScratch,
}

impl Decision {
    pub(crate) fn reset(&mut self, n: usize) {
        self.selected = None;
        self.preference = None;
        self.pending = false;
        self.fired.clear();
        self.unknown.clear();
        // Reset in place: the backend count is the same decision after decision.
        if self.backends.len() != n {
            self.backends.resize(n, BackendResult::default());
        }
        self.backends.fill(BackendResult::default());
    }

    /// Exit status of `explain`: 0 selected, 1 none can serve.
    pub fn exit_code(&self) -> i32 {
        if self.selected.is_some() { 0 } else { 1 }
    }
}
