//! Records where the vendored nginx that the module is compiled against was
//! built, so that the Makefile can copy the matching nginx binary. (Only the
//! vendored build writes the file: the builds against Debian's nginx share
//! the target folder and must not overwrite it.)
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=NGINX_BUILD_DIR");
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
