//! Writing saved values to a safetensors file: written beside the target under a temporary
//! name and renamed into place, so that a reader never sees a half-written file; the file's
//! permissions follow the process umask like any other file the user creates.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::{DType, TensorData};
use safetensors::tensor::{Dtype, TensorView};

use crate::error::{Error, Result};

/// Staging folders of writes in progress, for [`remove_partial_files`].
static IN_PROGRESS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes the temporary files of writes still in progress. A program that can be interrupted
/// mid-write calls it from its SIGINT/SIGTERM handler before exiting (the `hookscope` binary
/// does), so that no partial file is left beside the output.
pub fn remove_partial_files() {
    let pending = IN_PROGRESS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for staging in pending.iter() {
        let _ = std::fs::remove_dir_all(staging);
    }
}

/// Named tensors (f32, i64, i32 or bool data) as safetensors views; `error` says what is
/// wrong with one.
fn views<'t>(
    tensors: &'t [(String, TensorData)],
    error: &dyn Fn(String) -> Error,
) -> Result<Vec<(&'t str, TensorView<'t>)>> {
    tensors
        .iter()
        .map(|(name, data)| {
            let dtype = match data.dtype() {
                DType::F32 => Dtype::F32,
                DType::I64 => Dtype::I64,
                DType::I32 => Dtype::I32,
                DType::Bool(_) => Dtype::BOOL,
                other => return Err(error(format!("`{name}`: cannot write dtype {other:?}"))),
            };
            let view = TensorView::new(dtype, data.shape().to_vec(), data.as_bytes())
                .map_err(|e| error(format!("`{name}`: {e}")))?;
            Ok((name.as_str(), view))
        })
        .collect()
}

/// Named tensors (f32, i64, i32 or bool data) as the bytes of a safetensors file, with
/// `metadata` in its header (what a server answers with).
pub fn safetensors_bytes(
    tensors: &[(String, TensorData)],
    metadata: std::collections::HashMap<String, String>,
) -> Result<Vec<u8>> {
    let error = |message: String| Error::Output {
        path: PathBuf::from("<answer>"),
        message,
    };
    let views = views(tensors, &error)?;
    safetensors::serialize(views, Some(metadata)).map_err(|e| error(e.to_string()))
}

/// Writes named tensors (f32, i64, i32 or bool data) to a safetensors file, atomically.
pub fn write_safetensors(path: &Path, tensors: &[(String, TensorData)]) -> Result<()> {
    let error = |message: String| Error::Output {
        path: path.to_path_buf(),
        message,
    };
    let views = views(tensors, &error)?;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default();
    // safetensors writes through a temporary file of its own and renames it into place; giving
    // it a private staging folder beside the target keeps that file findable for
    // `remove_partial_files`, and the rename out of it atomic (same file system).
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let staging = directory.join(format!(
        ".{}.{}.{}.partial",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let lock = || {
        IN_PROGRESS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    };
    lock().push(staging.clone());
    let staged = staging.join(name);
    let written = std::fs::create_dir(&staging)
        .map_err(|e| error(format!("cannot create {}: {e}", staging.display())))
        .and_then(|()| {
            safetensors::serialize_to_file(views, None, &staged).map_err(|e| error(e.to_string()))
        })
        .and_then(|()| {
            // Like any file the user creates: 0666 less the umask (not the 0600 of a temp file).
            let mode = std::fs::Permissions::from_mode(0o666 & !process_umask());
            std::fs::set_permissions(&staged, mode).map_err(|e| error(e.to_string()))
        })
        .and_then(|()| std::fs::rename(&staged, path).map_err(|e| error(e.to_string())));
    let _ = std::fs::remove_dir_all(&staging);
    lock().retain(|pending| *pending != staging);
    written
}

/// The process umask, read from `/proc/self/status` (reading it through `umask(2)` would
/// change it for a moment under other threads); the common `022` where that is unavailable.
fn process_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
            u32::from_str_radix(line.trim(), 8).ok()
        })
        .unwrap_or(0o022)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use burn::tensor::TensorData;

    #[test]
    fn output_files_are_renamed_into_place_with_umask_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        let tensors = [("x".to_string(), TensorData::new(vec![1.0f32, 2.0], [2]))];
        super::write_safetensors(&path, &tensors).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        let umask = super::process_umask();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !umask);
        assert!(super::IN_PROGRESS.lock().unwrap().is_empty());
    }
}
