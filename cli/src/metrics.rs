//! `rivet metrics [PREFIX]`: rivetd's Prometheus exposition (`GET /metrics`), whole or only
//! the families whose name starts with PREFIX — a quick look without a Prometheus server.

use crate::client::Client;
use anyhow::Result;
use clap::Args;

/// `rivet metrics …`
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Only metrics whose name starts with this (e.g. `rivet_nodes`); their HELP and TYPE
    /// lines included.
    pub prefix: Option<String>,
}

/// The lines of `text` that belong to metrics named `prefix…`.
fn filter(text: &str, prefix: Option<&str>) -> Vec<String> {
    let Some(prefix) = prefix else {
        return text.lines().map(str::to_string).collect();
    };
    text.lines()
        .filter(|l| {
            let name = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            name.starts_with(prefix)
        })
        .map(str::to_string)
        .collect()
}

/// Print the metrics.
pub async fn run(args: MetricsArgs, client: &Client) -> Result<()> {
    let text = client.get_text("/metrics").await?;
    for line in filter(&text, args.prefix.as_deref()) {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_keeps_help_type_and_samples_of_matching_families() {
        let text = "# HELP rivet_nodes Nodes.\n# TYPE rivet_nodes gauge\n\
                    rivet_nodes{provision_state=\"available\"} 3\n\
                    # HELP rivet_conductors_alive Alive.\n# TYPE rivet_conductors_alive gauge\n\
                    rivet_conductors_alive 1\n";
        assert_eq!(
            filter(text, Some("rivet_nodes")),
            [
                "# HELP rivet_nodes Nodes.",
                "# TYPE rivet_nodes gauge",
                "rivet_nodes{provision_state=\"available\"} 3"
            ]
        );
        assert_eq!(filter(text, None).len(), 6);
    }
}
