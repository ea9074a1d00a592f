//! `hookscope extract` from the command line: the Slurm and Kubernetes examples run as written
//! (with the scheduler's environment faked), shards merge, and a run that dies mid-way resumes to
//! the files of an uninterrupted one.

use std::path::{Path, PathBuf};
use std::process::Command;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hookscope"))
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> String {
    repository()
        .join("conformance/fixtures/gpt2-tiny")
        .display()
        .to_string()
}

/// `PATH` with the test binary's folder first, as a cluster image would have `hookscope`.
fn path_with_binary() -> String {
    let dir = binary().parent().unwrap().to_path_buf();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `count` text prompts of a few words, one JSON object per line.
fn write_prompts(path: &Path, count: usize) {
    let words = [
        "the", "tower", "is", "in", "city", "of", "Paris", "a", "river",
    ];
    let lines: Vec<String> = (0..count)
        .map(|k| {
            let text: Vec<&str> = (0..1 + k % 7)
                .map(|w| words[(k + w) % words.len()])
                .collect();
            serde_json::json!({ "text": text.join(" ") }).to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn succeed(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed:\n{stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The bytes of every row file in `dir`, by name.
fn row_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_slurm_and_kubernetes_examples_run_shards_that_merge() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    write_prompts(&prompts, 37);
    let examples = repository().join("examples/extract");
    let (slurm_out, k8s_out) = (dir.path().join("slurm"), dir.path().join("k8s"));
    for task in 0..4 {
        succeed(
            Command::new("bash")
                .arg(examples.join("slurm.sbatch"))
                .args([
                    &fixture(),
                    prompts.to_str().unwrap(),
                    slurm_out.to_str().unwrap(),
                ])
                .env("PATH", path_with_binary())
                .env("SLURM_ARRAY_TASK_ID", task.to_string())
                .env("SLURM_ARRAY_TASK_COUNT", "4"),
        );
    }
    // The Indexed Job's container command, run as each pod would run it.
    let job = std::fs::read_to_string(examples.join("k8s-indexed-job.yaml")).unwrap();
    let command = job
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix("- hookscope extract"))
        .map(|rest| format!("hookscope extract{rest}"))
        .expect("the Job runs `hookscope extract`");
    for index in 0..4 {
        succeed(
            Command::new("sh")
                .args(["-c", &command])
                .env("PATH", path_with_binary())
                .env("JOB_COMPLETION_INDEX", index.to_string())
                .env("SHARDS", "4")
                .env("MODEL", fixture())
                .env("PROMPTS", &prompts)
                .env("OUT_DIR", &k8s_out),
        );
    }
    for out in [&slurm_out, &k8s_out] {
        let report = succeed(
            Command::new(binary())
                .args(["extract", "--merge-manifests", "--out-dir"])
                .arg(out),
        );
        assert!(report.starts_with("37 prompts"), "{report}");
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(manifest["shards"].as_array().unwrap().len(), 4);
        assert_eq!(manifest["prompts"], 37);
        assert_eq!(manifest["dtype"], "f16", "gpt2-tiny's config says float16");
    }
    assert_eq!(
        row_files(&slurm_out),
        row_files(&k8s_out),
        "both schedulers' runs write the same files"
    );
}

/// A run that dies part-way (its fourth row file cannot be put in place: a directory stands at
/// its path, so the run fails there after three files, at the same point on every machine)
/// resumes to the very files and manifest of an uninterrupted run.
#[test]
fn an_interrupted_run_resumes_to_the_files_of_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    write_prompts(&prompts, 600);
    let extract = |out: &Path| {
        let mut command = Command::new(binary());
        command
            .args(["extract", &fixture(), "--save", "layers.*.layer_output"])
            .args(["--save", "next_token_probs", "--batch-size", "4"])
            .args(["--max-rows-per-file", "64", "--prompts"])
            .arg(&prompts)
            .arg("--out-dir")
            .arg(out);
        command
    };
    let whole = dir.path().join("whole");
    succeed(&mut extract(&whole));
    let interrupted = dir.path().join("interrupted");
    let blocked = interrupted.join("extract-000003.safetensors");
    std::fs::create_dir_all(&blocked).unwrap();
    let output = extract(&interrupted).output().unwrap();
    assert!(
        !output.status.success(),
        "the run stops at the blocked file"
    );
    assert!(interrupted.join("extract-000002.safetensors").is_file());
    assert!(
        !interrupted.join("manifest.json").exists(),
        "the run stopped before it finished"
    );
    std::fs::remove_dir(&blocked).unwrap();
    succeed(&mut extract(&interrupted));
    assert_eq!(row_files(&whole), row_files(&interrupted));
    assert_eq!(
        std::fs::read_to_string(whole.join("manifest.json")).unwrap(),
        std::fs::read_to_string(interrupted.join("manifest.json")).unwrap(),
    );
}
