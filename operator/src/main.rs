//! `switchback-operator`: reconciles LLMRoute and ProviderCredential resources into the
//! config the proxy loads. For now only the `crds` subcommand exists.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "switchback-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions (the same bytes as `crds/*.yaml`).
    Crds {
        /// Instead of printing, write one `<plural>.<group>.yaml` file per CRD into DIR.
        #[arg(long, value_name = "DIR")]
        write: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Crds { write: None } => {
            print!("{}", switchback_crds::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Crds { write: Some(dir) } => {
            match switchback_crds::crdgen::write_crd_files(&dir) {
                Ok(paths) => {
                    for path in paths {
                        eprintln!("wrote {}", path.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("error: writing CRDs into {}: {err}", dir.display());
                    ExitCode::FAILURE
                }
            }
        }
    }
}
