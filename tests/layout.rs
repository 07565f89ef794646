//! The house rules, checked: each crate's Layout table (in its `lib.rs`:
//! `src/lib.rs` for the binary crate, `crates/aqw-core/src/lib.rs` for the
//! engine, `crates/aqw-azure/src/lib.rs` for the Azure adapter) names every file of that crate and nothing that is gone, the
//! README's Layout section maps every crate in at most 15 rows, no source
//! file is over 700 lines, and no function is over 60
//! (`scripts/fn_lengths.py`). When a table drifts, this test says which
//! file to add or remove. And every file in `tests/` is a module of the
//! one integration test binary, `tests/it.rs` (Cargo.toml has
//! `autotests = false`: a file left out would never be compiled or run).

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: &str = "60";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Each crate: its source folder and the file holding its Layout table.
const CRATES: &[(&str, &str)] = &[
    ("src", "src/lib.rs"),
    ("crates/aqw-core/src", "crates/aqw-core/src/lib.rs"),
    ("crates/aqw-azure/src", "crates/aqw-azure/src/lib.rs"),
];

/// A Layout table's rows (in `lib`, a crate's `lib.rs`): each row's backticked words.
fn layout_rows(lib: &str) -> Vec<Vec<String>> {
    let lib = std::fs::read_to_string(root().join(lib)).unwrap();
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
fn every_file_of_a_crate_is_on_its_layout_table() {
    for (tree, lib) in CRATES {
        let rows = layout_rows(lib);
        assert!(rows.len() >= 5, "no Layout table found in {lib}");
        let mut files = Vec::new();
        src_files(&root().join(tree), &mut files);
        files.sort();
        let missing: Vec<_> = files.iter().filter(|f| !is_mapped(f, &rows)).collect();
        assert!(
            missing.is_empty(),
            "files missing from the Layout table in {lib}: {missing:?}"
        );
    }
}

/// Paths a table or the README names that should exist.
fn is_repo_path(word: &str) -> bool {
    ["src/", "crates/", "scripts/", "bench/", "tests/"]
        .iter()
        .any(|p| word.starts_with(p))
}

#[test]
fn every_path_on_the_layout_table_exists() {
    let gone: Vec<_> = CRATES
        .iter()
        .flat_map(|(_, lib)| layout_rows(lib))
        .flatten()
        .filter(|w| is_repo_path(w))
        .filter(|w| !root().join(w).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "the Layout table names paths that do not exist: {gone:?}"
    );
}

/// The README's Layout section: its table's rows, each row's backticked words.
fn readme_layout_rows() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Layout"))
        .expect("README.md has a Layout section");
    section
        .lines()
        .filter_map(|l| l.strip_prefix('|'))
        .filter(|row| !row.starts_with("---") && !row.starts_with(" crate |"))
        .map(|row| {
            row.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

#[test]
fn the_readme_maps_every_crate_in_at_most_15_rows() {
    let rows = readme_layout_rows();
    assert!(
        (2..=15).contains(&rows.len()),
        "the README's Layout table has {} rows (2 to 15)",
        rows.len()
    );
    let words: Vec<&String> = rows.iter().flatten().collect();
    let gone: Vec<_> = words
        .iter()
        .filter(|w| is_repo_path(w) && !root().join(w.as_str()).exists())
        .collect();
    assert!(
        gone.is_empty(),
        "the README's Layout names paths that do not exist: {gone:?}"
    );
    // Every source file lies under a folder or is a file the README names.
    for (tree, _) in CRATES {
        let mut files = Vec::new();
        src_files(&root().join(tree), &mut files);
        let unmapped: Vec<_> = files
            .iter()
            .filter(|f| {
                !words
                    .iter()
                    .any(|w| *w == *f || (w.ends_with('/') && f.starts_with(w.as_str())))
            })
            .collect();
        assert!(
            unmapped.is_empty(),
            "files under no row of the README's Layout: {unmapped:?}"
        );
    }
}

#[test]
fn no_source_file_is_over_700_lines() {
    let mut files = Vec::new();
    for (tree, _) in CRATES {
        src_files(&root().join(tree), &mut files);
    }
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
fn no_function_is_over_60_lines() {
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

/// The modules `tests/it.rs` declares (`mod name;`, any `#[cfg]` aside).
fn it_modules() -> Vec<String> {
    let it = std::fs::read_to_string(root().join("tests/it.rs")).unwrap();
    it.lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_file_in_tests_is_a_module_of_the_it_binary() {
    let declared = it_modules();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("tests")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let is_module = if path.is_dir() {
            path.join("mod.rs").exists()
        } else {
            path.extension().is_some_and(|e| e == "rs") && name != "it"
        };
        if is_module && !declared.contains(&name) {
            missing.push(format!(
                "tests/{}",
                path.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    missing.sort();
    assert!(declared.len() > 20, "no module list found in tests/it.rs");
    assert!(
        missing.is_empty(),
        "files in tests/ that tests/it.rs does not declare (never compiled): {missing:?}"
    );
}
