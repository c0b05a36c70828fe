//! The `tandem` command: parses the arguments, runs the command, and turns any error into a
//! short message on stderr and a non-zero exit status.
use clap::error::ErrorKind;
use clap::Parser;
use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    // Mesa's drivers print "XDG_RUNTIME_DIR is invalid" on every adapter probe when it is unset
    // (headless servers, CI); those lines would bury our own one-line errors.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            // As for every command's output: a closed pipe is status 141, any other failed
            // write an error (`print!` would panic on either).
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            return match write!(stdout, "{e}").and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(cli::BROKEN_PIPE_STATUS as u8),
                Err(err) => {
                    eprintln!("error: standard output: {err}");
                    ExitCode::from(1)
                }
            };
        }
        Err(e) => {
            // clap's report has blank lines and a usage block; three lines say it all.
            let text = e.render().to_string();
            for line in text.lines().filter(|l| !l.trim().is_empty()).take(3) {
                eprintln!("{line}");
            }
            return ExitCode::from(2);
        }
    };
    // On the CPU backend's pool, so that CPU ops start their parallel passes without a hand-off.
    match tandem::on_cpu_pool(|| cli::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(cli::exit_code(&e))
        }
    }
}
