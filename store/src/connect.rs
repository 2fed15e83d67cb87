//! From a URL to a store client, with credentials and endpoints taken the way `object_store` and
//! the AWS tools take them.

use crate::StoreError;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreScheme};
use std::sync::Arc;

/// URL schemes read as object storage; another `scheme://` is refused, anything else is a
/// local path.
const SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss", "http", "https",
];

/// Whether `location` is a URL (`s3://…`, `gs://…`, `az://…`, `https://…`, or any other
/// `scheme://`) rather than a local directory. A scheme dsc does not read is refused when the
/// URL is opened ([`crate::Remote::open`]), naming it: taken as a path, `ftp://host/x` became a
/// local folder named `ftp:`.
pub fn is_remote(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| {
        let mut chars = scheme.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// Whether `scheme` is one dsc reads caches from.
fn supported(scheme: &str) -> bool {
    SCHEMES.contains(&scheme.to_ascii_lowercase().as_str())
}

/// The store and the prefix inside it that `url` names, configured from the environment, then
/// `options` (object_store's configuration keys, e.g. `aws_endpoint`, `aws_region`,
/// `google_service_account`; they win over the environment), then the URL itself.
pub(crate) fn connect(
    url: &str,
    options: &[(String, String)],
) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StoreError> {
    let bad = |problem: String| StoreError::Url {
        url: url.into(),
        problem,
    };
    let unknown = |key: &str, store: &str| {
        bad(format!(
            "option {key:?} is not a configuration key of {store} (object_store's keys, e.g. \
             aws_endpoint, aws_region, google_service_account, azure_storage_account_name)"
        ))
    };
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !scheme.is_some_and(supported) {
        let hint = if scheme.is_some_and(|s| s.eq_ignore_ascii_case("file")) {
            "; a local folder is given as its path, without file://"
        } else {
            ""
        };
        return Err(bad(format!(
            "not an object storage URL dsc reads (schemes: {}){hint}",
            SCHEMES.join(", ")
        )));
    }
    let link = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let (scheme, parsed) = ObjectStoreScheme::parse(&link).map_err(|e| bad(e.to_string()))?;
    let prefix = match link.scheme().starts_with("http") {
        // An HTTP(S) URL is a URL (a server's, or a store's such as Azure's blob endpoint): its
        // path is percent-encoded, and its `?` and `#` are not part of it.
        true => parsed,
        // `s3://bucket/name`, as the AWS tools take it: the name after the bucket as given,
        // `é`, `%`, `#` and `?` included (a URL parser would decode `%41` and cut at `#`).
        false => raw_prefix(url).map_err(bad)?,
    };
    let failed = |source| StoreError::Store {
        url: url.into(),
        source,
    };
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            let mut builder = AmazonS3Builder::from_env();
            for (key, value) in aws_shared_settings() {
                if let Ok(key) = key.parse::<AmazonS3ConfigKey>() {
                    builder = builder.with_config(key, value);
                }
            }
            for (key, value) in options {
                let parsed = key.parse().map_err(|_| unknown(key, "S3"))?;
                builder = builder.with_config(parsed, value);
            }
            let mut builder = builder.with_url(url);
            let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
            // An S3-compatible server on plain HTTP (MinIO, moto, a localhost test server):
            // the AWS CLI talks to it as given; so does dsc.
            if endpoint.is_some_and(|e| e.starts_with("http://")) {
                builder = builder.with_allow_http(true);
            }
            Arc::new(builder.build().map_err(failed)?)
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let mut builder = GoogleCloudStorageBuilder::from_env();
            for (key, value) in options {
                let parsed = key
                    .parse()
                    .map_err(|_| unknown(key, "Google Cloud Storage"))?;
                builder = builder.with_config(parsed, value);
            }
            Arc::new(builder.with_url(url).build().map_err(failed)?)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let mut builder = MicrosoftAzureBuilder::from_env();
            for (key, value) in options {
                let parsed = key.parse().map_err(|_| unknown(key, "Azure"))?;
                builder = builder.with_config(parsed, value);
            }
            Arc::new(builder.with_url(url).build().map_err(failed)?)
        }
        ObjectStoreScheme::Http => {
            // The store is the server; the path is the cache's prefix on it.
            let root = &link[..url::Position::BeforePath];
            let mut client = ClientOptions::new().with_allow_http(link.scheme() == "http");
            for (key, value) in options {
                let parsed = key.parse().map_err(|_| unknown(key, "HTTP"))?;
                client = client.with_config(parsed, value);
            }
            Arc::new(
                HttpBuilder::new()
                    .with_url(root)
                    .with_client_options(client)
                    .build()
                    .map_err(failed)?,
            )
        }
        other => return Err(bad(format!("{other:?} is not object storage"))),
    };
    Ok((store, prefix))
}

/// What the AWS tools would take from their shared files for the profile in use (`AWS_PROFILE`,
/// else `default`), as object_store configuration keys: the credentials from
/// `~/.aws/credentials` (`AWS_SHARED_CREDENTIALS_FILE`) unless the environment gives a key, the
/// region and endpoint from `~/.aws/config` (`AWS_CONFIG_FILE`) unless the environment gives
/// them. Environment variables win, as they do for the AWS CLI.
fn aws_shared_settings() -> Vec<(String, String)> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let home = env("HOME").unwrap_or_default();
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let mut out = Vec::new();
    if env("AWS_ACCESS_KEY_ID").is_none() {
        let file = env("AWS_SHARED_CREDENTIALS_FILE")
            .unwrap_or_else(|| format!("{home}/.aws/credentials"));
        if let Ok(text) = std::fs::read_to_string(file) {
            for (key, value) in ini_section(&text, &profile) {
                let key = match key.as_str() {
                    "aws_access_key_id" => "aws_access_key_id",
                    "aws_secret_access_key" => "aws_secret_access_key",
                    "aws_session_token" => "aws_session_token",
                    _ => continue,
                };
                out.push((key.to_string(), value));
            }
        }
    }
    let file = env("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config"));
    if let Ok(text) = std::fs::read_to_string(file) {
        // The config file names profiles other than `default` as `[profile NAME]`.
        let section = if profile == "default" {
            profile.clone()
        } else {
            format!("profile {profile}")
        };
        for (key, value) in ini_section(&text, &section) {
            let (key, given) = match key.as_str() {
                "region" => (
                    "aws_region",
                    env("AWS_REGION").or(env("AWS_DEFAULT_REGION")),
                ),
                "endpoint_url" => (
                    "aws_endpoint",
                    env("AWS_ENDPOINT_URL").or(env("AWS_ENDPOINT")),
                ),
                _ => continue,
            };
            if given.is_none() {
                out.push((key.to_string(), value));
            }
        }
    }
    out
}

/// The `key = value` lines of section `[name]` of an INI file (keys lower-cased).
fn ini_section(text: &str, name: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == name;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    out
}

/// The object name prefix of a bucket URL (`s3://bucket/a/b`, `az://container/a`,
/// `abfss://container@account.dfs.core.windows.net/a`): what follows the bucket, exactly as
/// written, without the slashes around it.
fn raw_prefix(url: &str) -> Result<ObjectPath, String> {
    let after = url.split_once("://").map_or(url, |(_, rest)| rest);
    let name = after.split_once('/').map_or("", |(_, name)| name);
    let name = name.trim_matches('/');
    ObjectPath::parse(name).map_err(|e| format!("not an object name a store takes: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_urls_are_told_from_local_paths() {
        for url in [
            "s3://b/c",
            "S3://b",
            "gs://b/c",
            "az://c/p",
            "https://h/p",
            "http://h:9/p",
        ] {
            assert!(is_remote(url), "{url}");
            assert!(supported(url.split_once("://").unwrap().0), "{url}");
        }
        for path in [
            "cache",
            "/data/cache",
            "./s3:/x",
            "s3:/b",
            "a b://c",
            "://x",
        ] {
            assert!(!is_remote(path), "{path}");
        }
        // URLs, but of no store dsc reads: refused by name when opened, never a local folder
        // named `ftp:`.
        for (url, says) in [
            ("ftp://h/x", "not an object storage URL dsc reads"),
            ("file:///x", "without file://"),
        ] {
            assert!(is_remote(url), "{url}");
            let err = connect(url, &[]).err().unwrap().to_string();
            assert!(err.contains(url) && err.contains(says), "{err}");
        }
    }

    #[test]
    fn a_profile_section_is_read_and_others_are_not() {
        let text = "[default]\naws_access_key_id = A\n# note\n[profile other]\nregion=eu-west-1\n\
                    [other]\nAWS_SECRET_ACCESS_KEY = S \n";
        assert_eq!(
            ini_section(text, "default"),
            vec![("aws_access_key_id".into(), "A".into())]
        );
        assert_eq!(
            ini_section(text, "profile other"),
            vec![("region".into(), "eu-west-1".into())]
        );
        assert_eq!(
            ini_section(text, "other"),
            vec![("aws_secret_access_key".into(), "S".into())]
        );
        assert!(ini_section(text, "missing").is_empty());
    }

    #[test]
    fn an_unknown_option_is_refused_naming_it() {
        let options = [("aws_endpoint_urk".to_string(), "http://x".to_string())];
        let e = connect("s3://bucket/c", &options).unwrap_err().to_string();
        assert!(
            e.contains("\"aws_endpoint_urk\" is not a configuration key of S3"),
            "{e}"
        );
    }

    #[test]
    fn a_local_path_or_another_scheme_is_refused_naming_the_url() {
        for url in ["cache", "file:///tmp/x", "memory:///x"] {
            let e = connect(url, &[]).unwrap_err().to_string();
            assert!(e.starts_with(url), "{e}");
        }
    }
}
