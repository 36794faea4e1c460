# ngx_gateway: build, test, run and benchmark.
#
#   make          build the module against Debian's nginx (objs/ngx_http_gateway_module.so)
#   DIST=trixie   (or bookworm) with any target: the same target for that Debian release, in a
#                 root of it that make keeps in target/dist/DIST/root (tools/dist-root; root, debootstrap)
#   make vendored build nginx 1.28 (--with-debug) and the module against it (objs/vendored/)
#   make deb      the Debian package libnginx-mod-http-gateway (objs/deb/DIST/), of the same build as make
#   make install  the stripped module and its load file under DESTDIR/PREFIX (VENDORED=1: the 1.28 build)
#   make test-deps  install the Debian packages the suites and benchmarks use (apt-get; root or sudo)
#   make test     test-deps, unit tests, the .t suites on both builds, the package (about 10 minutes);
#                 in a DIST root: the suites on that release's nginx, the package, the unit tests,
#                 and the cache suites again against Valkey where the release has it
#   make test-package  install the .deb here, a site with both gateways, requests, purge (root)
#   make run      a throwaway PostgreSQL + nginx with nginx-conf/demo.conf
#                 (PORT=8080, PGPORT=55432, REDISPORT=56380, DIR=/tmp/ngx-gateway-demo)
#   make stop     stop what make run started (the same DIR=)
#   make bench    wrk through the gateway next to pgbench in the same run
#   make bench-scale  the figures behind docs/scaling.md (pool sizes, PgBouncer, a cluster's slot map, a partition)
#   make bench-fanout one event to 10,000 subscribers (sqldb_listen, cache_subscribe, cache_stream): worker RSS and delivery times
#   make check    cargo fmt --check, clippy -D warnings, the panic guards and tools/code-metrics (src/, core/src/)
#   make miri     core's unit and random-sequence tests under Miri (nightly)
#   make fuzztest the fuzz checks on stable Rust over the seeds and pseudo-random inputs (part of make test)
#   make fuzz     every fuzz target under cargo-fuzz for FUZZ_RUNS inputs (nightly; installs cargo-fuzz)
#   make fuzz-short  every fuzz target for FUZZ_SECONDS with cargo-fuzz, else the stable fuzztest
#   make test-valgrind  the .t suites (VALGRIND_TESTS, default t/) with Debian's nginx and the module
#                 under valgrind memcheck (VALGRIND_BUILD=vendored: the vendored nginx 1.28 and its
#                 build of the module); fails on a memory error, a definite leak or a cut-short report
#
# Building (make, make deb, make install) installs nothing: a missing
# package stops it with the apt-get line to run. No target starts, stops,
# disables or reconfigures a service of the machine: the suites run their
# own nginx, PostgreSQL and Redis on free loopback ports.

SHELL        := /bin/bash

# The Debian release to build and test for: the machine's own unless DIST
# names another, in which case every target runs inside a root of that
# release (tools/dist-root), with that release's nginx, PostgreSQL, Redis
# and Rust toolchain. Each release's objs/deb/DIST/ holds its package.
HOST_DIST    := $(shell . /etc/os-release 2>/dev/null && echo $$VERSION_CODENAME)
HOST_RELEASE := $(shell . /etc/os-release 2>/dev/null && echo $$VERSION_ID)
DIST         ?= $(HOST_DIST)

ifneq ($(DIST),$(HOST_DIST))
# The packages a root of each release holds: what make test installs there,
# and Debian's own Rust toolchain (bookworm's rustc-web is 1.85, its rustc
# too old). The rest of this file is read inside the root.
DIST_TOOLCHAIN_bookworm := cargo-web rustc-web
DIST_TOOLCHAIN          := $(or $(DIST_TOOLCHAIN_$(DIST)),cargo rustc)
DIST_GOALS              := $(or $(MAKECMDGOALS),all)
DIST_PACKAGES            = $(shell $(MAKE) -s --no-print-directory DIST=$(DIST) HOST_DIST=$(DIST) GATEWAY_DIST_ROOT=$(DIST) print-test-packages)

.PHONY: $(DIST_GOALS)
$(firstword $(DIST_GOALS)):
	bash tools/dist-root $(DIST) "$(DIST_PACKAGES) $(DIST_TOOLCHAIN)" -- make $(DIST_GOALS) $(MAKEOVERRIDES)
$(filter-out $(firstword $(DIST_GOALS)),$(DIST_GOALS)): $(firstword $(DIST_GOALS))
	@:
else

CARGO        ?= cargo
OBJS         := $(CURDIR)/objs
DEB_SRC      := /usr/share/nginx/src
# NGINX_SRC=DIR: build against that nginx source (the version of the nginx
# that will load the module, e.g. nginx.org's packages), configured
# --with-compat, instead of Debian's.
NGINX_SRC    ?=
DEB_BUILD    := $(CURDIR)/target/$(if $(NGINX_SRC),nginx-src-$(shell printf %s '$(abspath $(NGINX_SRC))' | md5sum | cut -c1-8),nginx-debian)
# One cargo target folder for the three builds of the module (Debian's
# nginx and the same with fault injection, with the release profile; the
# vendored nginx, with the quick profile): the crates they have in common
# are compiled once per profile. The module itself is a cdylib, whose file two builds of one
# profile share there, so a build after the other compiles the module crate
# again, never its dependencies.
MODULE_TARGET   := $(CURDIR)/target/module
MODULE       := ngx_http_gateway_module.so
DEB_MODULE   := $(OBJS)/$(MODULE)
VEN_MODULE   := $(OBJS)/vendored/$(MODULE)
VEN_NGINX    := $(OBJS)/vendored/nginx

# What building needs (dpkg-dev for Debian's build flags, below); make deb
# also needs debhelper.
BUILD_PACKAGES := $(if $(NGINX_SRC),,nginx-dev) libpq-dev libclang-dev clang pkg-config \
                  libpcre2-dev libssl-dev zlib1g-dev make gcc binutils dpkg-dev
DEB_PACKAGES   := $(BUILD_PACKAGES) debhelper
# What make run uses besides.
RUN_PACKAGES   := nginx postgresql openssl redis-server
# What the suites and benchmarks use besides (make test-deps): on Debian 13
# PostgreSQL's contrib modules are in its server package, and Valkey is
# there for the cache suites' second run; debootstrap makes the roots of
# make DIST=....
DIST_TEST_PACKAGES_bookworm := postgresql-contrib
DIST_TEST_PACKAGES_trixie   := valkey-server valkey-tools
TEST_PACKAGES  := $(DEB_PACKAGES) $(RUN_PACKAGES) $(DIST_TEST_PACKAGES_$(DIST)) redis-server wrk $(if $(GATEWAY_DIST_ROOT),,debootstrap) \
                  libtest-base-perl libtext-diff-perl libipc-run-perl liburi-perl \
                  libwww-perl libnginx-mod-http-srcache-filter libnginx-mod-http-set-misc \
                  file memcached libnginx-mod-http-memc pgbouncer strace \
                  python3-prometheus-client chromium libnginx-mod-http-image-filter curl

# $(call missing,PACKAGES): those of the list that dpkg has not installed.
missing = $(strip $(shell for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done))
# $(call need,PACKAGES,WHAT): stops with the apt-get line when one is missing.
need = $(if $(call missing,$(1)),$(error $(2) needs Debian packages that are not installed; install them with: apt-get install $(call missing,$(1))))

# One build serves make, make deb and make install: cargo gets the same
# environment from all three (Debian's build flags, which dpkg-buildpackage
# sets, for the C that some crates compile; the last commit's time as
# SOURCE_DATE_EPOCH, which the package's changelog carries too), so that
# dpkg-buildpackage's environment does not make cargo build it again.
export CFLAGS   := $(shell dpkg-buildflags --get CFLAGS 2>/dev/null)
export CXXFLAGS := $(shell dpkg-buildflags --get CXXFLAGS 2>/dev/null)
export CPPFLAGS := $(shell dpkg-buildflags --get CPPFLAGS 2>/dev/null)
export LDFLAGS  := $(shell dpkg-buildflags --get LDFLAGS 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git -C $(CURDIR) log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH

FUZZ_RUNS    ?= 10000000
FUZZ_SECONDS ?= 20
FUZZ_TARGET  := $(CURDIR)/fuzz/target

.PHONY: all build fault vendored build-deps deb-deps run-deps test-deps valgrind-deps unittest miri deb install test-package fuzztest fuzz fuzz-short cargo-fuzz test test-chain-debian test-chain-vendored test-chain-rest test-debian test-vendored suites-debian suites-vendored suites-fault suites-valkey print-test-packages test-valgrind run stop bench bench-scale bench-fanout check clean

all: build

build: $(DEB_MODULE)

# The oldest Rust that builds the module: Cargo.toml's rust-version, which
# is Debian 13's rustc (and Debian 12's rustc-web); make DIST=trixie builds
# with exactly that. On Debian 12 itself, rustc is 1.63: cargo is rustup's
# or rustc-web's; the check says where to get it.
RUST_MIN := $(shell sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
build-deps:
	$(call need,$(BUILD_PACKAGES),building the module)
	@v=$$($(CARGO) --version 2>/dev/null | sed -n 's/^cargo \([0-9][0-9.]*\).*/\1/p'); \
	if [ -z "$$v" ] || [ "$$(printf '%s\n' $(RUST_MIN) "$$v" | sort -V | head -n 1)" != $(RUST_MIN) ]; then \
	    echo "building the module needs Rust $(RUST_MIN) or later (cargo: $${v:-not found}); on Debian 13: apt-get install cargo;" >&2; \
	    echo "on Debian 12: apt-get install cargo-web (Debian's Rust $(RUST_MIN) or later), or with rustup:" >&2; \
	    echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . \"\$$HOME/.cargo/env\"" >&2; \
	    exit 1; \
	fi
deb-deps:
	$(call need,$(DEB_PACKAGES),make deb)
run-deps:
	$(call need,$(BUILD_PACKAGES) $(RUN_PACKAGES),make run)

# Installs the missing packages of the suites and benchmarks (apt-get; root
# or sudo) and does nothing else: the services some of them bring are left
# as apt leaves them.
test-deps:
	@missing="$(call missing,$(TEST_PACKAGES))"; \
	if [ -n "$$missing" ]; then \
	    echo "installing: $$missing"; \
	    sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# Debian ships nginx's headers and configure script but no objs/: configure a
# copy with Debian's flags. Another source (NGINX_SRC) is configured
# --with-compat, the signature of nginx.org's builds, which dynamic modules
# built so load into.
$(DEB_BUILD)/objs/ngx_auto_config.h: | build-deps
	rm -rf $(DEB_BUILD) && mkdir -p $(DEB_BUILD)
ifeq ($(NGINX_SRC),)
	cp -r $(DEB_SRC)/. $(DEB_BUILD)/
	cd $(DEB_BUILD) && . ./conf_flags && ./configure "$${NGX_CONF_FLAGS[@]}" >configure.log
else
	@test -x $(NGINX_SRC)/configure || { echo "NGINX_SRC=$(NGINX_SRC) is not an nginx source folder (no configure)"; exit 1; }
	cp -r $(abspath $(NGINX_SRC))/. $(DEB_BUILD)/
	cd $(DEB_BUILD) && ./configure --with-compat >configure.log
endif

# $(call cargo_module,ENV,FEATURES,FILE[,PROFILE]): cargo builds the module
# in the shared target folder (release profile unless PROFILE) and FILE
# receives it. The build and the copy hold the profile's lock: another build
# of that profile between them would replace the file (builds of two
# profiles may run side by side).
define cargo_module
	mkdir -p $(MODULE_TARGET) $(dir $(3))
	flock $(MODULE_TARGET)/.build-$(or $(4),release).lock sh -c '$(1) $(CARGO) build --profile $(or $(4),release) $(2) --target-dir $(MODULE_TARGET) && \
	    cp $(MODULE_TARGET)/$(or $(4),release)/lib$(MODULE) $(3).new'
	mv -f $(3).new $(3)
endef

$(DEB_MODULE): $(DEB_BUILD)/objs/ngx_auto_config.h FORCE
	$(call cargo_module,NGINX_BUILD_DIR=$(DEB_BUILD)/objs,,$(DEB_MODULE))

# The Debian build with fault injection (NGX_GATEWAY_PANIC=<entry point>),
# for the suites that show every entry point survives a panic (FAULT_TESTS).
# Built with the release profile, beside the Debian build: only the
# module's own crate is compiled again, on the same dependencies.
FAULT_MODULE := $(OBJS)/fault/$(MODULE)
FAULT_TESTS  := t/002-panics.t t/130-cancel-race.t t/133-connect-thread.t

fault: $(DEB_BUILD)/objs/ngx_auto_config.h FORCE
	$(call cargo_module,NGINX_BUILD_DIR=$(DEB_BUILD)/objs,--features fault-injection,$(FAULT_MODULE))

# With debug logging (--with-debug), so that the suites see the module's
# debug traces on one of the two builds; with auth_request, which Debian's
# nginx has and the suites and guides use.
vendored: build-deps FORCE
	$(call cargo_module,NGX_CONFIGURE_ARGS="--with-debug --with-threads --with-http_auth_request_module",--features vendored,$(VEN_MODULE),quick)
	cp "$$(cat $(MODULE_TARGET)/quick/nginx-build-dir)/nginx" $(VEN_NGINX)

unittest:
	$(CARGO) test -p gateway-core --target-dir $(MODULE_TARGET)

# core's tests under Miri (nightly; the component is added when missing).
miri:
	@rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^miri' || rustup component add --toolchain nightly miri
	$(CARGO) +nightly miri test -p gateway-core --target-dir $(CURDIR)/target/miri

# The fuzz checks of fuzz/src/checks/ without libFuzzer (stable Rust).
fuzztest:
	$(CARGO) test --manifest-path fuzz/Cargo.toml --target-dir $(FUZZ_TARGET)

cargo-fuzz:
	@$(CARGO) +nightly --version >/dev/null || { echo "make fuzz needs the nightly toolchain (rustup toolchain install nightly)"; exit 1; }
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

fuzz: cargo-fuzz
	bash fuzz/run.sh runs $(FUZZ_RUNS)

# About FUZZ_SECONDS per target with cargo-fuzz when nightly and cargo-fuzz
# are there, else the stable fuzztest.
fuzz-short:
	@if $(CARGO) +nightly --version >/dev/null 2>&1 && $(CARGO) fuzz --version >/dev/null 2>&1; then \
	    bash fuzz/run.sh seconds $(FUZZ_SECONDS); \
	else \
	    echo "no nightly toolchain or cargo-fuzz: running the stable fuzztest"; \
	    $(MAKE) fuzztest; \
	fi

# Three chains side by side: the build against Debian's nginx, then the
# suites on it (but FAULT_TESTS); the vendored nginx's build, then the
# suites on it; core's unit tests and fuzz checks, the package built and
# tried, the fault-injection build and FAULT_TESTS on it, then the checks.
# The builds come first, side by side: the unit tests and fuzz checks build
# while the package waits for the Debian build, and the rest of the third
# chain fills the time the suites spend waiting. Nothing heavier than one
# build runs beside the suites: three builds at once beside both suites
# made the Sentinels of t/217 and t/218 (down after 700 ms) fail over on
# their own. (Each chain's output is printed whole when it ends. Debian's
# nginx is configured once, before them: two chains would configure it at
# once. A chain's steps are lines of their own: one make given several
# goals would run them side by side.)
ifndef GATEWAY_DIST_ROOT
test: test-deps
	$(MAKE) $(DEB_BUILD)/objs/ngx_auto_config.h
	$(MAKE) -j3 --output-sync=recurse test-chain-debian test-chain-vendored test-chain-rest

test-chain-rest:
	$(MAKE) unittest
	$(MAKE) fuzztest
	$(MAKE) test-package
	$(MAKE) fault
	$(MAKE) suites-fault
	$(MAKE) check
else
# In a root of another release (make test DIST=...): the suites on that
# release's nginx beside core's unit tests (with the release's own Rust),
# the package built and tried, the fault-injection build and FAULT_TESTS;
# then, alone (two runs of the Sentinel suites at once on a busy
# machine make Sentinels fail over on their own), the cache suites again
# against Valkey where the release has it. The vendored nginx is the same
# 1.28 whatever the release: the host's make test runs the suites on it.
test: test-deps
	$(MAKE) $(DEB_BUILD)/objs/ngx_auto_config.h
	$(MAKE) -j2 --output-sync=recurse test-chain-debian test-chain-rest
	$(if $(shell command -v valkey-server),$(MAKE) suites-valkey)

test-chain-rest:
	$(MAKE) unittest
	$(MAKE) test-package
	$(MAKE) fault
	$(MAKE) suites-fault
endif

test-chain-debian:
	$(MAKE) build
	$(MAKE) suites-debian SKIP_TESTS="$(FAULT_TESTS)"

test-chain-vendored:
	$(MAKE) vendored
	$(MAKE) suites-vendored

# The .t suites against one nginx build; t/lib/harness holds the runner
# (an upstream Test::Nginx::Socket earlier in @INC is used instead). Files
# run PROVE_JOBS at a time: each has its own nginx, PostgreSQL and Redis on
# free loopback ports and its own folders under TMPDIR (/dev/shm when it is
# not set, see t/run-suite). The longest go
# first, so that the others fill in beside them (t/run-suite). Three at a
# time: the files mostly wait (for failovers, timeouts, streams), and a
# whole suite takes about half a core beside them.
PROVE_JOBS ?= 3
# (By the times t/run-suite prints, longest first.)
SLOW_FIRST := t/217-sentinel.t t/214-cache-stream-read.t t/215-cache-stream-bytes.t t/132-listen-replay.t t/204-cluster.t \
              t/009-doc-examples.t t/223-sentinel-partition.t t/007-browser.t t/206-cache-pubsub.t t/128-listen.t t/220-sentinel-replicas.t \
              t/006-sse-bounds.t t/208-cache-pipeline.t t/118-pg-faults.t t/126-target.t t/129-jwt.t
TESTS      ?= $(SLOW_FIRST) $(filter-out $(SLOW_FIRST),$(sort $(wildcard t/*.t)))
# (SKIP_TESTS: files of TESTS left out.)
PROVE       = PROVE_JOBS=$(PROVE_JOBS) PROVE_FLAGS="$(PROVE_FLAGS)" t/run-suite $(filter-out $(SKIP_TESTS),$(TESTS))

test-debian: build fault
	$(MAKE) suites-debian
test-vendored: vendored
	$(MAKE) suites-vendored

# The suites alone, on what the builds above left in objs/.
suites-debian:
	@echo "=== suites on Debian's nginx: $$(/usr/sbin/nginx -v 2>&1)"
	TEST_NGINX_BINARY=/usr/sbin/nginx TEST_NGINX_LOAD_MODULES=$(DEB_MODULE) TEST_NGINX_FAULT_MODULE=$(FAULT_MODULE) $(PROVE)

suites-vendored:
	@echo "=== suites on the vendored nginx: $$($(VEN_NGINX) -v 2>&1)"
	TEST_NGINX_BINARY=$(VEN_NGINX) TEST_NGINX_LOAD_MODULES=$(VEN_MODULE) $(PROVE)

# FAULT_TESTS of TESTS alone, on Debian's nginx with the fault-injection
# build (suites-debian runs them too, unless they are in SKIP_TESTS).
suites-fault:
	@echo "=== fault-injection suites on Debian's nginx: $$(/usr/sbin/nginx -v 2>&1)"
	$(if $(filter $(FAULT_TESTS),$(TESTS)),TEST_NGINX_BINARY=/usr/sbin/nginx TEST_NGINX_LOAD_MODULES=$(DEB_MODULE) \
	    TEST_NGINX_FAULT_MODULE=$(FAULT_MODULE) PROVE_JOBS=$(PROVE_JOBS) PROVE_FLAGS="$(PROVE_FLAGS)" \
	    t/run-suite $(filter $(FAULT_TESTS),$(TESTS)),@true)

# The cache suites (t/2*.t, and those of TESTS) against Valkey instead of
# Redis: the suites start TEST_REDIS_SERVER and run TEST_REDIS_CLI.
VALKEY_TESTS ?= $(filter t/2%,$(TESTS))
suites-valkey:
	@echo "=== cache suites on Debian's nginx against $$(valkey-server --version | cut -d' ' -f1-3)"
	TEST_REDIS_SERVER=valkey-server TEST_REDIS_CLI=valkey-cli TEST_NGINX_BINARY=/usr/sbin/nginx \
	    TEST_NGINX_LOAD_MODULES=$(DEB_MODULE) TEST_NGINX_FAULT_MODULE=$(FAULT_MODULE) \
	    PROVE_JOBS=$(PROVE_JOBS) PROVE_FLAGS="$(PROVE_FLAGS)" t/run-suite $(VALKEY_TESTS)

# The packages make test-deps installs (for a root of another release).
print-test-packages:
	@echo $(TEST_PACKAGES)

# The suites with nginx (Debian's, and the Debian build of the module; with
# VALGRIND_BUILD=vendored the vendored nginx 1.28 and its build, which make
# vendored makes, as suites-vendored runs them) under valgrind's memcheck
# (t/lib/ValgrindCheck.pm, suppressions in t/valgrind.supp): a block or
# nginx_start whose nginx processes show a memory error, a definite leak
# or a cut-short report fails, and tools/valgrind-summary prints the
# totals of target/valgrind/summary.tsv (target/valgrind-vendored/ for the
# vendored build; logs with findings in its logs/). Each file's line ends
# with its time. Not part of make test. VALGRIND_TESTS picks files;
# PROVE_FLAGS=-j2 runs two at a time (all of t/ in about half an hour on
# two cores); TEST_NGINX_VALGRIND_OPTS adds valgrind options
# (--track-origins=yes: where an uninitialised value came from),
# TEST_NGINX_VALGRIND_SUPP another suppressions file.
VALGRIND_TESTS ?= t/
VALGRIND_BUILD ?= debian
ifeq ($(VALGRIND_BUILD),vendored)
VALGRIND_OUT    := $(CURDIR)/target/valgrind-vendored
VALGRIND_MAKE   := vendored
VALGRIND_NGINX  := $(VEN_NGINX)
VALGRIND_ENV    := TEST_NGINX_LOAD_MODULES=$(VEN_MODULE)
else ifeq ($(VALGRIND_BUILD),debian)
VALGRIND_OUT    := $(CURDIR)/target/valgrind
VALGRIND_MAKE   := build fault
VALGRIND_NGINX  := /usr/sbin/nginx
VALGRIND_ENV    := TEST_NGINX_LOAD_MODULES=$(DEB_MODULE) TEST_NGINX_FAULT_MODULE=$(FAULT_MODULE)
else
$(if $(filter test-valgrind,$(MAKECMDGOALS)),$(error VALGRIND_BUILD is debian or vendored, not "$(VALGRIND_BUILD)"))
endif

valgrind-deps:
	@dpkg-query -W -f='$${Status}' valgrind 2>/dev/null | grep -q 'install ok installed' || { \
	    echo "installing: valgrind"; \
	    sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends valgrind; \
	}

test-valgrind: test-deps valgrind-deps
	$(MAKE) $(VALGRIND_MAKE)
	@echo "=== suites under valgrind on the $(VALGRIND_BUILD) build: $$($(VALGRIND_NGINX) -v 2>&1), $$(valgrind --version)"
	rm -rf $(VALGRIND_OUT)
	status=0; \
	TEST_NGINX_USE_VALGRIND=1 TEST_NGINX_VALGRIND_DIR=$(VALGRIND_OUT) TEST_NGINX_BINARY=$(VALGRIND_NGINX) $(VALGRIND_ENV) \
	    prove -I t/lib/harness --timer $(PROVE_FLAGS) $(VALGRIND_TESTS) || status=$$?; \
	perl tools/valgrind-summary $(VALGRIND_OUT)/summary.tsv || status=1; \
	exit $$status

# The Debian package, the Debian way (debian/: debhelper and nginx-dev's
# dh_nginx), against Debian's nginx. The version is Cargo.toml's with the
# release it is built for (0.1.0+deb13u1, as Debian's own updates name
# theirs), so that the packages of two releases can sit in one apt
# repository; the Rust toolchain may be rustup's, which dpkg does not know
# of (hence -d).
VERSION     := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
DEB_VERSION := $(VERSION)+deb$(HOST_RELEASE)u1
DEB_OUT     := $(OBJS)/deb/$(DIST)

deb: deb-deps $(DEB_BUILD)/objs/ngx_auto_config.h
	printf 'libnginx-mod-http-gateway (%s) %s; urgency=medium\n\n  * ngx_gateway %s (the version of Cargo.toml) for Debian %s.\n\n -- ngx_gateway developers <maintainers@ngx-gateway.org>  %s\n' \
	    "$(DEB_VERSION)" "$(DIST)" "$(VERSION)" "$(HOST_RELEASE)" "$$(date -R -d @$(SOURCE_DATE_EPOCH))" > debian/changelog
	dpkg-buildpackage -us -uc -b -d
	mkdir -p $(DEB_OUT)
	mv ../libnginx-mod-http-gateway_$(DEB_VERSION)_*.deb ../libnginx-mod-http-gateway-dbgsym_$(DEB_VERSION)_*.deb ../libnginx-mod-http-gateway_$(DEB_VERSION)_*.buildinfo \
	    ../libnginx-mod-http-gateway_$(DEB_VERSION)_*.changes $(DEB_OUT)/
	@ls -l $(DEB_OUT)/*.deb

# The package on this machine (root): install, a site with sqldb_* and
# cache_pass, requests, purge; the machine is left as it was.
test-package: deb
	TEST_PACKAGE_DEB=$$(ls $(DEB_OUT)/libnginx-mod-http-gateway_$(DEB_VERSION)_*.deb) prove -I t/lib/harness $(PROVE_FLAGS) t/package/

# make install [DESTDIR=...] [PREFIX=/usr]: the module built against
# Debian's nginx (or, with VENDORED=1, against the vendored nginx 1.28) and a
# load file, as the package lays them out.
PREFIX      ?= /usr
MODULES_DIR ?= $(PREFIX)/lib/nginx/modules
INSTALL_SO  := $(if $(VENDORED),$(VEN_MODULE),$(DEB_MODULE))

install: $(if $(VENDORED),vendored,build)
	install -d $(DESTDIR)$(MODULES_DIR) $(DESTDIR)$(PREFIX)/share/nginx/modules-available
	install -m 0644 $(INSTALL_SO) $(DESTDIR)$(MODULES_DIR)/$(MODULE)
	strip --strip-unneeded --remove-section=.comment --remove-section=.note $(DESTDIR)$(MODULES_DIR)/$(MODULE)
	echo "load_module $(MODULES_DIR)/$(MODULE);" > $(DESTDIR)$(PREFIX)/share/nginx/modules-available/mod-http-gateway.conf

PORT   ?= 8080
PGPORT ?= 55432
REDISPORT ?= 56380
DIR    ?= /tmp/ngx-gateway-demo

run: run-deps build
	PORT=$(PORT) PGPORT=$(PGPORT) REDISPORT=$(REDISPORT) DIR=$(DIR) bash nginx-conf/run.sh

stop:
	DIR=$(DIR) bash nginx-conf/run.sh stop

bench: test-deps build
	bash bench/run.sh

bench-scale: test-deps build
	python3 bench/scale.py

bench-fanout: test-deps build
	python3 bench/fanout.py

check: $(DEB_BUILD)/objs/ngx_auto_config.h
	$(CARGO) fmt --all -- --check
	@out=$$(python3 tools/code-metrics) || { echo "$$out" | grep -v "^[a-z_/]*\.rs " ; exit 1; }; echo "$$out" | tail -4
	@out=$$(python3 tools/code-metrics core/src) || { echo "$$out" | grep -v "^[a-z_/]*\.rs " ; exit 1; }; echo "core/src: $$(echo "$$out" | grep "^no file over")"
	NGINX_BUILD_DIR=$(DEB_BUILD)/objs $(CARGO) clippy --release --target-dir $(MODULE_TARGET) --workspace -- -D warnings
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --manifest-path fuzz/Cargo.toml --target-dir $(FUZZ_TARGET) --all-targets -- -D warnings

# (The roots of make DIST=... first let go of their mounts: of this
# checkout, /dev, /proc and /sys.)
clean:
	@if [ -d target/dist ]; then bash tools/dist-root --release; fi
	@! grep -q " $(CURDIR)/target/dist/" /proc/self/mounts || { echo "target/dist/ still has mounts: not removed"; exit 1; }
	rm -rf --one-file-system $(OBJS) target $(FUZZ_TARGET)

FORCE:

endif
