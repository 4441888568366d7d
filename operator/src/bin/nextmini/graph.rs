//! `nextmini graph`: a running topology as Mermaid, Graphviz DOT or HTML.

use crate::local::Local;
use nextmini_operator::observe::{self, graph, load};

#[derive(clap::Args, Debug)]
pub struct GraphArgs {
    /// Topology to draw (default: the only one running).
    topology: Option<String>,
    /// Output format: mermaid (for Markdown), dot (`| dot -Tsvg`), or html (a
    /// self-contained page: open it in a browser).
    #[arg(short, long, value_enum, default_value = "mermaid")]
    output: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Format {
    Mermaid,
    Dot,
    Html,
}

pub async fn graph(local: &Local, args: GraphArgs) -> anyhow::Result<i32> {
    let store = crate::tools::running_store(local).await?;
    let topology = crate::tools::pick_topology(&store, args.topology).await?;
    let Some(topo) = load::load(&store, &topology).await? else {
        anyhow::bail!("topology {topology} was removed meanwhile");
    };
    match args.output {
        Format::Mermaid => print!("{}", graph::mermaid(&topo)),
        Format::Dot => print!("{}", graph::dot(&topo)),
        Format::Html => {
            let now = chrono::Utc::now()
                .format("%Y-%m-%d %H:%M:%S UTC")
                .to_string();
            print!("{}", graph::html(&topo, None, &now));
            if let Some(addr) = observe::running_address(&local.state_dir) {
                eprintln!("live, refreshing every second: http://{addr}/graph/{topology}");
            }
        }
    }
    Ok(0)
}
