//! The caller's device pointers for one call, by the role a graph binds them to: what the
//! executor (`exec.rs`) and the per-sequence-length kernels (`varlen.rs`) both read.

use crate::cudnn::graph::IoRole;
use crate::executor::{DeviceBackwardArgs, DeviceForwardArgs};

/// Pointers of the caller's tensors for one call (CUdeviceptr values; 0 when unused).
#[derive(Clone, Copy, Debug, Default)]
pub struct IoPtrs {
    /// Q.
    pub q: u64,
    /// K.
    pub k: u64,
    /// V.
    pub v: u64,
    /// O.
    pub o: u64,
    /// LSE.
    pub lse: u64,
    /// dO.
    pub d_o: u64,
    /// dQ.
    pub dq: u64,
    /// dK.
    pub dk: u64,
    /// dV.
    pub dv: u64,
}

impl IoPtrs {
    pub(crate) fn get(&self, r: IoRole) -> u64 {
        match r {
            IoRole::Q => self.q,
            IoRole::K => self.k,
            IoRole::V => self.v,
            IoRole::O => self.o,
            IoRole::Stats => self.lse,
            IoRole::DO => self.d_o,
            IoRole::DQ => self.dq,
            IoRole::DK => self.dk,
            IoRole::DV => self.dv,
        }
    }
}

impl From<&DeviceForwardArgs> for IoPtrs {
    fn from(a: &DeviceForwardArgs) -> Self {
        IoPtrs {
            q: a.q,
            k: a.k,
            v: a.v,
            o: a.o,
            lse: a.lse,
            ..Default::default()
        }
    }
}

impl From<&DeviceBackwardArgs> for IoPtrs {
    fn from(a: &DeviceBackwardArgs) -> Self {
        IoPtrs {
            q: a.q,
            k: a.k,
            v: a.v,
            o: a.o,
            lse: a.lse,
            d_o: a.d_o,
            dq: a.dq,
            dk: a.dk,
            dv: a.dv,
        }
    }
}
