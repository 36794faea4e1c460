//! The fuzz checks on stable Rust, without libFuzzer: every target's check
//! over its seed corpus (fuzz/corpus/<target>/), then over pseudo-random
//! inputs, half of them made by changing the seeds. Deterministic: the same
//! inputs on every run. `FUZZ_STABLE_RUNS` sets the inputs per target.
//!
//! A failing input is written to fuzz/target/stable-failures/<target>-<n>,
//! to be replayed with `cargo fuzz run <target> <file>` or this test.

use gateway_core::testrng::TestRng;
use gateway_core_fuzz::checks::TARGETS;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

const DEFAULT_RUNS: usize = 100_000;

fn seeds(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Random bytes, short ones more often than long ones.
fn random_input(rng: &mut TestRng) -> Vec<u8> {
    let len = match rng.index(4) {
        0 => rng.index(8),
        1 | 2 => rng.index(64),
        _ => rng.index(1024),
    };
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// A seed with a few bytes changed, inserted, removed, or a piece of
/// another seed put in.
fn mutate(rng: &mut TestRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.index(4) {
        let at = rng.index(v.len() + 1);
        match rng.index(5) {
            0 if at < v.len() => v[at] = rng.next_u64() as u8,
            1 if at < v.len() => v[at] ^= 1 << rng.index(8),
            2 => v.insert(at, rng.next_u64() as u8),
            3 if at < v.len() => {
                v.remove(at);
            }
            _ => {
                let from = rng.index(other.len() + 1);
                let to = from + rng.index(other.len() - from + 1);
                v.splice(at..at, other[from..to].iter().copied());
            }
        }
    }
    v
}

fn run(target: &str) {
    let check = TARGETS.iter().find(|t| t.0 == target).unwrap().1;
    let runs = std::env::var("FUZZ_STABLE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RUNS);
    let seeds = seeds(target);
    assert!(!seeds.is_empty(), "no seeds for {target}");
    let try_one = |n: usize, input: &[u8], what: &str| {
        if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/stable-failures");
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{target}-{n}"));
            std::fs::write(&file, input).unwrap();
            panic!("{target}: {what} failed, input saved as {}", file.display());
        }
    };
    for (i, (path, seed)) in seeds.iter().enumerate() {
        try_one(i, seed, &format!("seed {}", path.display()));
    }
    let mut rng = TestRng::new(target.bytes().fold(0x9E37_79B9_7F4A_7C15, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    }));
    for n in 0..runs {
        let input = if n % 2 == 0 {
            random_input(&mut rng)
        } else {
            let a = &seeds[rng.index(seeds.len())].1;
            let b = &seeds[rng.index(seeds.len())].1;
            mutate(&mut rng, a, b)
        };
        try_one(n, &input, &format!("random input {n}"));
    }
}

#[test]
fn redis_exchange() {
    run("redis_exchange");
}

#[test]
fn resp_reply() {
    run("resp_reply");
}

#[test]
fn template_split() {
    run("template_split");
}

#[test]
fn sql_statements() {
    run("sql_statements");
}

#[test]
fn conninfo() {
    run("conninfo");
}

#[test]
fn rds_decode() {
    run("rds_decode");
}

#[test]
fn formats() {
    run("formats");
}

#[test]
fn methods() {
    run("methods");
}

#[test]
fn cluster_slots() {
    run("cluster_slots");
}

#[test]
fn pubsub_stream() {
    run("pubsub_stream");
}

#[test]
fn jwt_token() {
    run("jwt_token");
}

#[test]
fn every_target_has_a_test_and_a_binary() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let me = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/stable.rs")).unwrap();
    for (name, _) in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} has no [[bin]]"
        );
        assert!(me.contains(&format!("run(\"{name}\")")), "{name} has no test");
    }
}
