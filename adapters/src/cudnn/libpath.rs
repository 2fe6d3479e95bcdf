//! Which libcudnn a process has already loaded (pure: tested everywhere). The `cudnn`
//! executor loads that one when there is one (see `enabled/dl.rs`).

/// Is `file` (a base name) the main cuDNN library (`libcudnn.so`, `libcudnn.so.9`,
/// `libcudnn.so.9.19.0`), not one of its sub-libraries (`libcudnn_graph.so.9`, ...)?
pub fn is_main_cudnn(file: &str) -> bool {
    file.strip_prefix("libcudnn.so").is_some_and(|rest| {
        rest.is_empty()
            || (rest.starts_with('.')
                && rest[1..]
                    .split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    })
}

/// The path of the main libcudnn mapped in a `/proc/<pid>/maps` text, if any.
pub fn cudnn_in_maps(maps: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            path.starts_with('/') && is_main_cudnn(path.rsplit('/').next().unwrap_or(path))
        })
        .map(str::to_string)
}

/// The libcudnn this process has already loaded, if any.
pub fn loaded_in_process() -> Option<String> {
    std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|m| cudnn_in_maps(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_main_library_matches() {
        for yes in ["libcudnn.so", "libcudnn.so.9", "libcudnn.so.9.19.0"] {
            assert!(is_main_cudnn(yes), "{yes}");
        }
        for no in [
            "libcudnn_graph.so.9",
            "libcudnn_engines_precompiled.so.9",
            "libcudnn.so.9.x",
            "libcudnn.so.",
            "libcudnn.sox",
            "libcublas.so.13",
        ] {
            assert!(!is_main_cudnn(no), "{no}");
        }
    }

    #[test]
    fn finds_the_mapped_library_in_a_maps_text() {
        let maps = "\
7f00 r--p 00000000 fd:01 1 /opt/venv/nvidia/cudnn/lib/libcudnn_graph.so.9
7f01 r-xp 00001000 fd:01 2 /opt/venv/nvidia/cudnn/lib/libcudnn.so.9
7f02 rw-p 00000000 00:00 0 [heap]
7f03 r--p 00000000 fd:01 3 /usr/lib/libc.so.6
";
        assert_eq!(
            cudnn_in_maps(maps).as_deref(),
            Some("/opt/venv/nvidia/cudnn/lib/libcudnn.so.9")
        );
        assert_eq!(cudnn_in_maps("7f02 rw-p 00000000 00:00 0 [heap]\n"), None);
    }
}
