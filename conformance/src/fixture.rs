//! Finding reference fixtures: every folder `scripts/make_fixtures.py` wrote, discovered from the
//! fixtures folder, so that a new fixture is picked up by every check and test that selects by
//! architecture or by the files it holds.

use std::path::{Path, PathBuf};

use hookscope::Architecture;

/// One reference fixture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixture {
    /// The folder's name (`gpt2-tied`).
    pub name: String,
    /// The folder.
    pub dir: PathBuf,
    /// Its `config.json`'s `model_type`.
    pub model_type: String,
}

impl Fixture {
    /// Whether `arch` serves this fixture's `model_type`.
    pub fn served_by(&self, arch: &Architecture) -> bool {
        arch.model_types.contains(&self.model_type.as_str())
    }

    /// Its `config.json`.
    ///
    /// # Panics
    /// When it cannot be read or parsed (it was read once already, to find the fixture).
    pub fn config(&self) -> serde_json::Value {
        let path = self.dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Whether the fixture holds `file` (e.g. `edits.safetensors`, written for some only).
    pub fn has(&self, file: &str) -> bool {
        self.dir.join(file).is_file()
    }
}

/// The fixtures in `folder`, sorted by name: its subfolders with a `reference.safetensors` and a
/// `config.json` naming a `model_type`.
pub fn fixtures_in(folder: &Path) -> Result<Vec<Fixture>, String> {
    let entries = std::fs::read_dir(folder)
        .map_err(|e| format!("cannot read fixtures folder {}: {e}", folder.display()))?;
    let mut found: Vec<Fixture> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|dir| dir.join("reference.safetensors").is_file())
        .filter_map(|dir| {
            let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
            let config: serde_json::Value = serde_json::from_str(&text).ok()?;
            let model_type = config.get("model_type")?.as_str()?.to_string();
            let name = dir.file_name()?.to_string_lossy().into_owned();
            Some(Fixture {
                name,
                dir,
                model_type,
            })
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// The committed fixtures of this repository ([`crate::fixtures_dir`]), sorted by name.
///
/// # Panics
/// When the folder cannot be read or holds no fixture (a broken checkout).
pub fn fixtures() -> Vec<Fixture> {
    let found = fixtures_in(&crate::fixtures_dir()).unwrap_or_else(|error| panic!("{error}"));
    assert!(
        !found.is_empty(),
        "no fixtures in {:?}",
        crate::fixtures_dir()
    );
    found
}

/// The registered architectures named `archs`.
///
/// # Panics
/// When one of them is not registered (a misspelt name would select nothing).
fn named(archs: &[&str]) -> Vec<&'static Architecture> {
    let registered = hookscope::registry::registered();
    archs
        .iter()
        .map(|name| {
            registered
                .iter()
                .copied()
                .find(|arch| arch.name == *name)
                .unwrap_or_else(|| panic!("no registered architecture `{name}`"))
        })
        .collect()
}

/// The committed fixtures that the registered architectures named `archs` serve.
///
/// # Panics
/// When there is none, so that a test over them cannot pass by checking nothing.
pub fn fixtures_of(archs: &[&str]) -> Vec<Fixture> {
    let serving = named(archs);
    let found: Vec<Fixture> = fixtures()
        .into_iter()
        .filter(|fixture| serving.iter().any(|arch| fixture.served_by(arch)))
        .collect();
    assert!(!found.is_empty(), "no committed fixture of {archs:?}");
    found
}

/// The first committed fixture (by name) of each architecture named `archs`.
///
/// # Panics
/// When one of them has none.
pub fn one_of_each(archs: &[&str]) -> Vec<Fixture> {
    first_of_each(&named(archs), |_| true)
}

/// The first committed fixture (by name) of every registered architecture among those
/// `accept` takes.
///
/// # Panics
/// When one of them has none (every built-in architecture comes with a fixture case).
pub fn one_per_architecture(accept: impl Fn(&Fixture) -> bool) -> Vec<Fixture> {
    first_of_each(&hookscope::registry::registered(), accept)
}

fn first_of_each(
    archs: &[&'static Architecture],
    accept: impl Fn(&Fixture) -> bool,
) -> Vec<Fixture> {
    let all: Vec<Fixture> = fixtures().into_iter().filter(accept).collect();
    archs
        .iter()
        .map(|arch| {
            all.iter()
                .find(|fixture| fixture.served_by(arch))
                .cloned()
                .unwrap_or_else(|| panic!("no committed fixture of `{}`", arch.name))
        })
        .collect()
}
