//! `stagedoor-jobs-afl <target>`: the fuzz target `<target>` (see `stagedoor_jobs_fuzz::TARGETS`)
//! under AFL++'s persistent loop. Run by `afl-fuzz ... -- target/release/stagedoor-jobs-afl
//! <target>` (fuzz/README.md).

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = stagedoor_jobs_fuzz::target(&name) else {
        let names: Vec<&str> = stagedoor_jobs_fuzz::TARGETS
            .iter()
            .map(|(n, _)| *n)
            .collect();
        eprintln!("usage: stagedoor-jobs-afl <target>: one of {names:?}");
        std::process::exit(2);
    };
    afl::fuzz!(|data: &[u8]| {
        target(data);
    });
}
