//! Tells the module what the libpq it is built against can do, and records
//! where the vendored nginx that the module is compiled against was
//! built, so that the Makefile can copy the matching nginx binary. (Only the
//! vendored build writes the file: the builds against Debian's nginx share
//! the target folder and must not overwrite it.)
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=NGINX_BUILD_DIR");
    libpq_features();
    if env::var_os("CARGO_FEATURE_VENDORED").is_none() {
        return;
    }
    let Ok(build_dir) = env::var("DEP_NGINX_BUILD_DIR") else {
        return;
    };
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: write next to the artifacts.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let _ = fs::write(profile_dir.join("nginx-build-dir"), format!("{build_dir}\n"));
    }
}

/// libpq 17 and later queue a pipeline's sync point without writing it
/// (`PQsendPipelineSync`): the module then writes a pass's queries at once
/// (`cfg(libpq_send_sync)`). The version is libpq's pkg-config file's, the
/// one libpq-sys builds against; without pkg-config, libpq 15's way is kept.
fn libpq_features() {
    println!("cargo::rustc-check-cfg=cfg(libpq_send_sync)");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let version = std::process::Command::new("pkg-config")
        .args(["--modversion", "libpq"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let major = version
        .as_deref()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_some_and(|m| m >= 17) {
        println!("cargo:rustc-cfg=libpq_send_sync");
    }
}
