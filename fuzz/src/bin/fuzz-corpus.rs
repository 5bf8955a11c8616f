//! `cargo run -p stagedoor-jobs-fuzz --bin fuzz-corpus -- seeds`: writes the seeds into
//! `fuzz/corpus/<target>/`. `... -- run <target> <file>...`: runs a target on files (a crash
//! or hang AFL found), reporting each.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("seeds") => {
            for (target, name, bytes) in stagedoor_jobs_fuzz::seeds::seeds() {
                let dir = stagedoor_jobs_fuzz::run::corpus_dir(target);
                if let Err(e) = std::fs::create_dir_all(&dir)
                    .and_then(|()| std::fs::write(dir.join(&name), &bytes))
                {
                    eprintln!("cannot write {}/{name}: {e}", dir.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Some("run") if args.len() >= 3 => {
            let Some(target) = stagedoor_jobs_fuzz::target(&args[1]) else {
                eprintln!("no target `{}`: the targets are {:?}", args[1], names());
                return ExitCode::FAILURE;
            };
            for file in &args[2..] {
                match std::fs::read(file) {
                    Ok(bytes) => {
                        stagedoor_jobs_fuzz::run::one(&args[1], target, &bytes);
                        println!("{file}: ok");
                    }
                    Err(e) => {
                        eprintln!("cannot read {file}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "usage: fuzz-corpus seeds | fuzz-corpus run <target> <file>... (targets: {:?})",
                names()
            );
            ExitCode::FAILURE
        }
    }
}

fn names() -> Vec<&'static str> {
    stagedoor_jobs_fuzz::TARGETS
        .iter()
        .map(|(n, _)| *n)
        .collect()
}
