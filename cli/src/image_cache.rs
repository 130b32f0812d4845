//! `rivet image-cache list|purge`: rivetd's image cache of `image_download_source = "local"`
//! deploys (`GET`/`DELETE /v1/image_cache`, admin).

use crate::client::Client;
use crate::output::{self, Output};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use serde_json::Value;

/// `rivet image-cache …`
#[derive(Debug, Subcommand)]
pub enum ImageCacheCmd {
    /// The cached images (content address, size, last use, the nodes reading them) and the
    /// hit, miss, revalidation and eviction counts.
    List,
    /// Remove every cached image no running deploy reads.
    Purge,
}

/// Run an image-cache command.
pub async fn run(cmd: ImageCacheCmd, client: &Client, out: Output) -> Result<()> {
    match cmd {
        ImageCacheCmd::List => list(client, out).await,
        ImageCacheCmd::Purge => purge(client, out).await,
    }
}

async fn list(client: &Client, out: Output) -> Result<()> {
    let doc = client.get("/v1/image_cache", &[]).await?;
    if out.json {
        output::print_json(&doc);
        return Ok(());
    }
    let images = doc
        .get("images")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("rivetd answered /v1/image_cache without an \"images\" list"))?;
    print!(
        "{}",
        output::table(
            &["Name", "Bytes", "Last used", "Pinned by", "URL"],
            &output::rows(images, &["name", "bytes", "last_used", "pinned_by", "url"])
        )
    );
    let s = &doc["stats"];
    println!(
        "{} bytes of {} in {}; hits {}, misses {}, revalidations {}, evictions {}",
        doc["bytes"],
        doc["max_bytes"],
        doc["dir"],
        s["hits"],
        s["misses"],
        s["revalidations"],
        s["evictions"]
    );
    Ok(())
}

async fn purge(client: &Client, out: Output) -> Result<()> {
    let doc = client
        .request::<()>(reqwest::Method::DELETE, "/v1/image_cache", &[], None)
        .await?
        .unwrap_or(Value::Null);
    if out.json {
        output::print_json(&doc);
        return Ok(());
    }
    let n = |k: &str| doc[k].as_array().map(Vec::len).unwrap_or(0);
    println!(
        "removed {} image(s); kept {} that running deploys read",
        n("removed"),
        n("kept_in_use")
    );
    Ok(())
}
