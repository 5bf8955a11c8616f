//! `stagedoor-jobs`: see the crate's documentation (`stagedoor_jobs_cli`), or `stagedoor-jobs --help`.

fn main() -> std::process::ExitCode {
    stagedoor_jobs_cli::run()
}
