//! Side files a command reads whole (a spec file, a loader state): a local path, or a URL in
//! object storage wherever rows take one.

use anyhow::Context as _;
use std::path::Path;

/// The text of `path` (`what` names it in errors): read from disk, or fetched when it is a URL
/// (with the environment's store options, as rows are).
pub fn read_text(path: &Path, what: &str) -> anyhow::Result<String> {
    let shown = path.display();
    let options = match dsc_store::is_remote(&path.to_string_lossy()) {
        true => dsc_loader::RemoteOptions::from_env()?.store,
        false => Vec::new(),
    };
    let bytes = dsc_store::read_location(&path.to_string_lossy(), &options)
        .with_context(|| format!("cannot read {what} {shown}"))?;
    String::from_utf8(bytes).with_context(|| format!("{what} {shown} is not UTF-8 text"))
}
