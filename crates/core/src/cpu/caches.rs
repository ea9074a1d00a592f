//! The size of this CPU's level-2 cache, which sizes the packed products' depth blocks.
//!
//! Read once from Linux's sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/`, the files
//! `lscpu` reads, on x86_64 and aarch64 alike); `None` elsewhere or where it is not listed, and
//! the products then keep blocks that fit the smallest L2 seen (512 KiB, Zen 2).

use std::path::Path;
use std::sync::OnceLock;

/// Bytes of the first CPU's level-2 data (or unified) cache, if the system lists it.
pub(crate) fn l2_bytes() -> Option<usize> {
    static L2: OnceLock<Option<usize>> = OnceLock::new();
    *L2.get_or_init(|| read_l2(Path::new("/sys/devices/system/cpu/cpu0/cache")))
}

/// The level-2 data cache's size among the `index*` folders under `caches`.
fn read_l2(caches: &Path) -> Option<usize> {
    let read = |index: &Path, file: &str| std::fs::read_to_string(index.join(file)).ok();
    std::fs::read_dir(caches).ok()?.flatten().find_map(|entry| {
        let index = entry.path();
        let level = read(&index, "level")?;
        let kind = read(&index, "type")?;
        (level.trim() == "2" && kind.trim() != "Instruction")
            .then(|| parse_size(&read(&index, "size")?))
            .flatten()
    })
}

/// A sysfs cache size: a number of bytes with an optional `K`, `M` or `G` suffix.
fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_sysfs_writes_them() {
        assert_eq!(parse_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("524288"), Some(512 << 10));
        for bad in ["", "K", "12Q", "1.5M", "99999999999999999999999G"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_level_2_data_cache_is_found_among_the_others() {
        let caches = tempfile::tempdir().unwrap();
        let index = |n: usize, level: &str, kind: &str, size: &str| {
            let folder = caches.path().join(format!("index{n}"));
            std::fs::create_dir(&folder).unwrap();
            for (file, text) in [("level", level), ("type", kind), ("size", size)] {
                std::fs::write(folder.join(file), format!("{text}\n")).unwrap();
            }
        };
        index(0, "1", "Data", "48K");
        index(1, "2", "Instruction", "64K");
        index(2, "3", "Unified", "32M");
        assert_eq!(read_l2(caches.path()), None);
        index(3, "2", "Unified", "2048K");
        assert_eq!(read_l2(caches.path()), Some(2 << 20));
        assert_eq!(read_l2(&caches.path().join("absent")), None);
    }
}
