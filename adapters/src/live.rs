//! Live device facts: what the machine running the executors actually has (the CUDA device's
//! compute capability, the libcudnn the `cudnn` executor loads), as te-family config keys, so a
//! decision is made for the device it runs on rather than for the one a config describes.
//!
//! Without the `cuda` feature or a GPU there is no live device ([`live_device`] says why); without
//! the `cudnn` feature (or a loadable libcudnn) the cuDNN version stays unknown.

use serde::Serialize;
use serde_json::{Value as Json, json};

/// The CUDA device the executors run on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveDevice {
    /// CUDA device ordinal.
    pub ordinal: usize,
    /// Its name as the driver reports it (`NVIDIA H200`).
    pub name: String,
    /// (major, minor).
    pub compute_capability: (u32, u32),
    /// (major, minor, patch) of the libcudnn the `cudnn` executor loads; `None` when none can be
    /// loaded (the reason is in `cudnn_unavailable`).
    pub cudnn_version: Option<(u32, u32, u32)>,
    /// Why no cuDNN version is known.
    pub cudnn_unavailable: Option<String>,
}

impl LiveDevice {
    /// The te-family config keys this device answers: `device_compute_capability` and, when a
    /// libcudnn loads, `cudnn_version`.
    pub fn te_config(&self) -> Json {
        let (major, minor) = self.compute_capability;
        let mut c = json!({"device_compute_capability": [major, minor]});
        if let Some((a, b, p)) = self.cudnn_version {
            c["cudnn_version"] = json!([a, b, p]);
        }
        c
    }

    /// One line: `NVIDIA H200 (sm_90, cuDNN 9.19.0)`.
    pub fn describe(&self) -> String {
        let (major, minor) = self.compute_capability;
        let cudnn = match self.cudnn_version {
            Some((a, b, p)) => format!("cuDNN {a}.{b}.{p}"),
            None => "no cuDNN".to_string(),
        };
        format!("{} (sm_{major}{minor}, {cudnn})", self.name)
    }
}

/// The live facts of CUDA device `ordinal`, or why there is no device to read them from.
pub fn live_device(ordinal: usize) -> Result<LiveDevice, String> {
    let (name, compute_capability) = crate::device::device_identity(ordinal)?;
    let (cudnn_version, cudnn_unavailable) = match crate::cudnn::loaded_version() {
        Ok(v) => (Some(v), None),
        Err(why) => (None, Some(why)),
    };
    Ok(LiveDevice {
        ordinal,
        name,
        compute_capability,
        cudnn_version,
        cudnn_unavailable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn te_config_reads_back_as_the_same_facts() {
        let d = LiveDevice {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            cudnn_version: Some((9, 19, 0)),
            cudnn_unavailable: None,
        };
        let facts = attn_policy::Facts::from_json(&d.te_config()).expect("valid te config");
        use attn_policy::facts::Value;
        assert_eq!(facts.get("sm"), Some(Value::Int(90)));
        match facts.get("cudnn_version") {
            Some(Value::Version(v)) => assert_eq!(v.parts, [9, 19, 0]),
            other => panic!("cudnn_version read back as {other:?}"),
        }
        assert_eq!(d.describe(), "NVIDIA H200 (sm_90, cuDNN 9.19.0)");
        let no_cudnn = LiveDevice {
            cudnn_version: None,
            cudnn_unavailable: Some("library missing".into()),
            ..d
        };
        assert!(no_cudnn.te_config().get("cudnn_version").is_none());
    }

    #[test]
    fn no_device_says_why() {
        // On a machine without a GPU (or without the `cuda` feature) the reason is given; on a
        // GPU machine the device is read.
        match live_device(0) {
            Ok(d) => assert!(d.compute_capability.0 >= 5, "{d:?}"),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
