//! The house rules, checked: the crate doc's Layout table (in `src/lib.rs`)
//! names every file in `src/` and nothing that is gone, no file in `src/` is
//! over 700 lines, and no function is over 60 (`scripts/fn_lengths.py`).
//! The table is the one map of the crate; when it drifts, this test says
//! which file to add or remove.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: &str = "60";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Layout table's rows: each row's backticked words.
fn layout_rows() -> Vec<Vec<String>> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! |"))
        .filter(|row| !row.starts_with("---") && !row.starts_with(" rule |"))
        .map(|row| {
            row.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Every file under `src/`, as `src/...` with forward slashes.
fn src_files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            src_files(&path, out);
        } else {
            let rel = path.strip_prefix(root()).unwrap();
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// A file is on the map when a row names it whole, or names its folder
/// (`src/ops/`) together with its path inside that folder (`replay.rs`) or
/// a sub-folder of it (`assets/`).
fn is_mapped(file: &str, rows: &[Vec<String>]) -> bool {
    rows.iter().any(|words| {
        words.iter().any(|w| w == file)
            || words.iter().any(|folder| {
                folder.ends_with('/')
                    && file.strip_prefix(folder.as_str()).is_some_and(|inner| {
                        words.iter().any(|w| {
                            w == inner || (w.ends_with('/') && inner.starts_with(w.as_str()))
                        })
                    })
            })
    })
}

#[test]
fn every_file_in_src_is_on_the_layout_table() {
    let rows = layout_rows();
    assert!(rows.len() > 10, "no Layout table found in src/lib.rs");
    let mut files = Vec::new();
    src_files(&root().join("src"), &mut files);
    files.sort();
    let missing: Vec<_> = files.iter().filter(|f| !is_mapped(f, &rows)).collect();
    assert!(
        missing.is_empty(),
        "files missing from the Layout table in src/lib.rs: {missing:?}"
    );
}

#[test]
fn every_path_on_the_layout_table_exists() {
    let gone: Vec<_> = layout_rows()
        .into_iter()
        .flatten()
        .filter(|w| w.starts_with("src/") || w.starts_with("scripts/") || w.starts_with("bench/"))
        .filter(|w| !root().join(w).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "the Layout table names paths that do not exist: {gone:?}"
    );
}

#[test]
fn no_file_in_src_is_over_700_lines() {
    let mut files = Vec::new();
    src_files(&root().join("src"), &mut files);
    let long: Vec<_> = files
        .iter()
        .filter(|f| f.ends_with(".rs"))
        .map(|f| {
            (
                f,
                std::fs::read_to_string(root().join(f))
                    .unwrap()
                    .lines()
                    .count(),
            )
        })
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:?}"
    );
}

#[test]
fn no_function_in_src_is_over_60_lines() {
    let out = std::process::Command::new("python3")
        .arg(root().join("scripts/fn_lengths.py"))
        .args(["--limit", MAX_FN_LINES])
        .current_dir(root())
        .output()
        .expect("python3 runs scripts/fn_lengths.py");
    assert!(
        out.status.success(),
        "functions over {MAX_FN_LINES} lines:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
