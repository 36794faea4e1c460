//! Records where the nginx build that the module is compiled against lives, so
//! that the Makefile and the test suites can find the matching nginx binary.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=NGINX_BUILD_DIR");
    let Ok(build_dir) = env::var("DEP_NGINX_BUILD_DIR") else {
        return;
    };
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: write next to the artifacts.
    if let Some(profile_dir) = out_dir.ancestors().nth(3) {
        let _ = fs::write(profile_dir.join("nginx-build-dir"), format!("{build_dir}\n"));
    }
}
