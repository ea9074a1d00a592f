//! Architectures loaded at run time from dynamic libraries (`hookscope --plugin PATH`).
//!
//! A plugin is a `cdylib` that statically links its own copy of hookscope-core and burn, so its
//! `inventory` registrations land in its own registry: its [`Architecture`] travels through the
//! return value of an exported function instead. Rust types cross the boundary only between
//! identical builds, so the host first reads the plugin's ABI fingerprint through a C-ABI symbol
//! and refuses the plugin, before calling anything else in it, unless it equals its own: same
//! hookscope-core version and a hash of its source, schema version, adapter interface version,
//! rustc, target, burn (version and dependency spec with its features), the backend features
//! enabled on hookscope-core, and the sizes of the burn types that cross the boundary. Each is
//! derived from the build itself (`build.rs`), none written by hand. The registry owns what a
//! plugin adds ([`crate::registry::add`]). A loaded plugin is never unloaded (its code and
//! vtables outlive every model it built).

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::adapter::Architecture;
use crate::error::{Error, Result};
use crate::registry;

/// Version of the hook schema (site names, shapes, order) this build implements.
pub const SCHEMA_VERSION: u32 = 2;

/// Version of the adapter interface ([`crate::CausalLm`], [`Architecture`], the per-call
/// context): bumped whenever a plugin built against the previous one would not fit.
pub const ADAPTER_VERSION: u32 = 9;

/// Symbol returning the plugin's fingerprint as a NUL-terminated C string.
pub const FINGERPRINT_SYMBOL: &[u8] = b"hookscope_plugin_fingerprint\0";
/// Symbol returning the plugin's `&'static Architecture` (Rust ABI; called only after the
/// fingerprints match).
pub const ARCHITECTURE_SYMBOL: &[u8] = b"hookscope_plugin_architecture\0";

/// What a plugin and its host must share, one `key=value` field per `;`.
pub fn abi_fingerprint() -> String {
    format!(
        "hookscope-core={}; source={}; schema={SCHEMA_VERSION}; adapter={ADAPTER_VERSION}; \
         rustc={}; target={}; burn={}; backends={}; layout=Device:{},Tensor:{}",
        env!("CARGO_PKG_VERSION"),
        env!("HOOKSCOPE_CORE_SOURCE"),
        env!("HOOKSCOPE_RUSTC_VERSION"),
        env!("HOOKSCOPE_TARGET"),
        env!("HOOKSCOPE_BURN"),
        env!("HOOKSCOPE_BACKEND_FEATURES"),
        std::mem::size_of::<burn::tensor::Device>(),
        std::mem::size_of::<burn::tensor::Tensor<2>>(),
    )
}

/// The files plugins were loaded from (each is loaded once).
static LOADED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn plugin_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Plugin {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Loads the architecture a plugin library exports, after checking its ABI fingerprint.
pub fn load(path: &Path) -> Result<&'static Architecture> {
    let canonical = path
        .canonicalize()
        .map_err(|e| plugin_error(path, format!("cannot open: {e}")))?;
    let mut loaded = LOADED
        .lock()
        .map_err(|_| plugin_error(path, "plugin registry poisoned"))?;
    if loaded.contains(&canonical) {
        return Err(plugin_error(path, "this plugin is already loaded"));
    }
    // SAFETY: loading a library runs its initialisers; a hookscope plugin has none beyond
    // Rust's own. Nothing else of it is called before its fingerprint matches.
    let library = unsafe { libloading::Library::new(&canonical) }
        .map_err(|e| plugin_error(path, format!("not a loadable library: {e}")))?;
    // SAFETY: the symbol is declared `extern "C" fn() -> *const c_char` by `export_plugin!`,
    // returning a pointer to a static NUL-terminated string.
    let fingerprint = unsafe {
        let symbol = library
            .get::<unsafe extern "C" fn() -> *const c_char>(FINGERPRINT_SYMBOL)
            .map_err(|_| {
                plugin_error(
                    path,
                    "not a hookscope plugin: no `hookscope_plugin_fingerprint` symbol \
                     (export it with `hookscope_core::export_plugin!`)",
                )
            })?;
        CStr::from_ptr(symbol()).to_string_lossy().into_owned()
    };
    let host = abi_fingerprint();
    if fingerprint != host {
        return Err(plugin_error(
            path,
            fingerprint_mismatch(&fingerprint, &host),
        ));
    }
    // SAFETY: the fingerprints match, so the plugin was built by the same compiler for the same
    // target from the same hookscope-core source and the same burn with the same backend
    // features: `Architecture` and everything it reaches have the same layout on both sides.
    let arch = unsafe {
        let symbol = library
            .get::<fn() -> &'static Architecture>(ARCHITECTURE_SYMBOL)
            .map_err(|_| plugin_error(path, "no `hookscope_plugin_architecture` symbol"))?;
        symbol()
    };
    registry::add(arch).map_err(|message| plugin_error(path, message))?;
    // Never unloaded: models built by the plugin keep pointing into its code.
    std::mem::forget(library);
    loaded.push(canonical);
    Ok(arch)
}

/// Says which fields differ between a plugin's fingerprint and the host's.
fn fingerprint_mismatch(plugin: &str, host: &str) -> String {
    let fields = |s: &str| -> Vec<(String, String)> {
        s.split("; ")
            .filter_map(|field| field.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let host_fields = fields(host);
    let differences: Vec<String> = fields(plugin)
        .into_iter()
        .filter_map(|(key, value)| {
            let ours = host_fields
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str());
            (ours != Some(value.as_str()))
                .then(|| format!("{key}: plugin `{value}`, host `{}`", ours.unwrap_or("?")))
        })
        .collect();
    let detail = if differences.is_empty() {
        format!("plugin `{plugin}`, host `{host}`")
    } else {
        differences.join("; ")
    };
    format!(
        "ABI mismatch, refused before calling into it ({detail}); rebuild the plugin against this hookscope"
    )
}

/// Exports an architecture from a plugin `cdylib`:
///
/// ```text
/// hookscope_core::export_plugin!(MyModel, name: "mine", model_types: ["mine"],
///     architectures: ["MineForCausalLM"], tiny_config: r#"{...}"#);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($($arguments:tt)*) => {
        static HOOKSCOPE_PLUGIN_ARCHITECTURE: $crate::Architecture =
            $crate::architecture!($($arguments)*);

        /// The ABI fingerprint, NUL-terminated.
        #[unsafe(no_mangle)]
        pub extern "C" fn hookscope_plugin_fingerprint() -> *const ::std::ffi::c_char {
            static FINGERPRINT: ::std::sync::LazyLock<::std::ffi::CString> =
                ::std::sync::LazyLock::new(|| {
                    ::std::ffi::CString::new($crate::plugin::abi_fingerprint()).unwrap_or_default()
                });
            FINGERPRINT.as_ptr()
        }

        /// The exported architecture.
        #[unsafe(no_mangle)]
        pub fn hookscope_plugin_architecture() -> &'static $crate::Architecture {
            &HOOKSCOPE_PLUGIN_ARCHITECTURE
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_name_the_differing_fields() {
        let host = abi_fingerprint();
        let ours = format!("schema={SCHEMA_VERSION}");
        let plugin = host.replace(&ours, "schema=99");
        let message = fingerprint_mismatch(&plugin, &host);
        assert!(
            message.contains(&format!("schema: plugin `99`, host `{SCHEMA_VERSION}`")),
            "{message}"
        );
    }

    /// A real library whose fingerprint says it was built with other backend features (burn's
    /// `Device` then has other variants) is refused before anything else of it is called, and
    /// the message names the field.
    #[test]
    fn a_plugin_built_with_other_backend_features_is_refused_by_name() {
        let host = abi_fingerprint();
        let ours = env!("HOOKSCOPE_BACKEND_FEATURES");
        let theirs = if ours.contains("cuda") {
            "flex"
        } else {
            "flex+cuda"
        };
        let plugin = host.replace(&format!("backends={ours}"), &format!("backends={theirs}"));
        assert_ne!(plugin, host, "the fingerprint names its backend features");
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("plugin.rs");
        std::fs::write(
            &source,
            format!(
                "#[unsafe(no_mangle)]\npub extern \"C\" fn hookscope_plugin_fingerprint() -> \
                 *const std::ffi::c_char {{ concat!({plugin:?}, \"\\0\").as_ptr().cast() }}\n"
            ),
        )
        .unwrap();
        let library = dir.path().join(format!(
            "{}other_backends{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ));
        let built = std::process::Command::new(env!("HOOKSCOPE_RUSTC"))
            .args(["--edition", "2024", "--crate-type", "cdylib", "-o"])
            .arg(&library)
            .arg(&source)
            .status()
            .unwrap();
        assert!(built.success(), "rustc builds the stand-in plugin");
        let error = load(&library).unwrap_err().to_string();
        assert!(
            error.contains(&format!("backends: plugin `{theirs}`, host `{ours}`")),
            "{error}"
        );
    }

    #[test]
    fn files_that_are_not_plugins_are_refused() {
        let missing = load(Path::new("/no/such/plugin.so")).unwrap_err();
        assert!(missing.to_string().contains("cannot open"), "{missing}");
        let dir = std::env::temp_dir().join(format!("hookscope-not-a-lib-{}", std::process::id()));
        std::fs::write(&dir, b"not a library").unwrap();
        let error = load(&dir).unwrap_err();
        assert!(
            error.to_string().contains("not a loadable library"),
            "{error}"
        );
        std::fs::remove_file(&dir).unwrap();
    }
}
