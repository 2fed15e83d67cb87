//! Writing a cache to object storage from the command line (`dsc compile --out s3://…`,
//! `dsc compress CACHE --out s3://…`): made under `--cache-dir`, uploaded with its manifest
//! last ([`dsc_store::Upload`]), with a progress bar.

use crate::args::RemoteArgs;
use dsc_compiler::Progress;
use std::path::Path;

/// The upload to `out`, if it is a URL (`None` for a local directory); a cache already there
/// is refused now unless `force`.
pub fn to(
    out: &Path,
    force: bool,
    remote: &RemoteArgs,
) -> anyhow::Result<Option<dsc_store::Upload>> {
    let Some(url) = out.to_str().filter(|o| dsc_store::is_remote(o)) else {
        return Ok(None);
    };
    let opts = remote.options()?;
    let store = dsc_store::Remote::open_with(url, &opts.store)?;
    Ok(Some(dsc_store::Upload::new(store, &opts.dir, force)?))
}

/// Uploads `upload`'s cache with a progress bar in MB.
pub fn send(
    upload: &dsc_store::Upload,
    progress: &dyn Progress,
) -> anyhow::Result<dsc_store::Uploaded> {
    let mut last = 0;
    let mut started = false;
    let sent = upload.send(
        |done, total| {
            if !started {
                progress.stage("upload (MB)", total >> 20);
                started = true;
            }
            progress.advance((done >> 20) - last);
            last = done >> 20;
        },
        &|| progress.interrupted(),
    )?;
    progress.finish();
    if sent.stray > 0 {
        // On stderr, so that --json stays one object.
        eprintln!(
            "note: {} objects under {} are not part of the cache (an interrupted upload's, or \
             files of your own); they were left as they were (--force removes them)",
            sent.stray,
            upload.url()
        );
    }
    Ok(sent)
}
