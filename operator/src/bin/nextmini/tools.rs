//! Commands for looking at a running network and for bringing one in:
//! `top`, `graph`, `completions`, `import`.

use crate::local::Local;
use anyhow::{Context, bail};
use clap::Subcommand;
use nextmini_operator::store::Store;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum Tools {
    /// Live per-link load of running topologies, refreshed every second (q or Ctrl-C quits).
    Top(crate::top::TopArgs),
    /// Draw a topology with its live link load: Mermaid, Graphviz DOT, or a
    /// self-contained HTML page.
    Graph(crate::graph::GraphArgs),
    /// Print a shell completion script (e.g. `nextmini completions bash > /etc/bash_completion.d/nextmini`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Convert another network lab's topology into a Nextmini manifest (printed on stdout).
    Import {
        #[command(subcommand)]
        from: ImportFrom,
    },
}

#[derive(Subcommand, Debug)]
pub enum ImportFrom {
    /// A containerlab topology (`*.clab.yml`): its nodes and links.
    Containerlab {
        /// The containerlab topology file.
        file: PathBuf,
    },
}

pub fn run(local: &Local, tool: Tools) -> anyhow::Result<i32> {
    match tool {
        Tools::Completions { shell } => {
            let mut command = <crate::Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "nextmini", &mut std::io::stdout());
            Ok(0)
        }
        Tools::Import {
            from: ImportFrom::Containerlab { file },
        } => import_containerlab(&file),
        Tools::Top(args) => tokio::runtime::Runtime::new()?.block_on(crate::top::top(local, args)),
        Tools::Graph(args) => {
            tokio::runtime::Runtime::new()?.block_on(crate::graph::graph(local, args))
        }
    }
}

fn import_containerlab(file: &std::path::Path) -> anyhow::Result<i32> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let source = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string());
    let imported = nextmini_operator::import::containerlab::convert(&source, &text)?;
    for note in &imported.notes {
        eprintln!("note: {note}");
    }
    print!("{}", imported.manifest);
    Ok(0)
}

/// The store of a running local mode, or a message saying nothing runs.
pub async fn running_store(local: &Local) -> anyhow::Result<Store> {
    match local.existing_store().await? {
        Some(s) => Ok(s),
        None => bail!(
            "nothing is running (the private PostgreSQL is stopped); start a topology with `nextmini up -f FILE`"
        ),
    }
}

/// The named topology, or the only one there is.
pub async fn pick_topology(store: &Store, named: Option<String>) -> anyhow::Result<String> {
    let names = nextmini_operator::observe::load::topology_names(store).await?;
    match named {
        Some(t) if names.contains(&t) => Ok(t),
        Some(t) if names.is_empty() => bail!("no topology named {t}: none is running"),
        Some(t) => bail!("no topology named {t} (running: {})", names.join(", ")),
        None => match names.as_slice() {
            [one] => Ok(one.clone()),
            [] => bail!("no topology is running; start one with `nextmini up -f FILE`"),
            many => bail!(
                "several topologies are running ({}): name one",
                many.join(", ")
            ),
        },
    }
}
