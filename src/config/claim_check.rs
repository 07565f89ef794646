//! `aqw.claimCheck`: when a job's body goes to Blob storage instead of the
//! queue message (`aqw_core::claim`), which container holds it, and the
//! largest body a reference may name.

use super::raw::RawClaimCheck;
use super::ConfigError;
use aqw_core::claim::{ClaimCheck, MAX_BYTES_CAP, MIN_THRESHOLD};
use aqw_core::message::{max_payload, MessageEncoding};

/// `aqw.claimCheck`, defaulted for `encoding`: the threshold between
/// [`MIN_THRESHOLD`] and the largest payload a message holds, the container
/// a valid Blob container name, `maxBytes` between the threshold and
/// [`MAX_BYTES_CAP`].
pub(super) fn validate(
    file: &str,
    raw: Option<&RawClaimCheck>,
    encoding: MessageEncoding,
) -> Result<ClaimCheck, ConfigError> {
    let mut c = ClaimCheck::defaults(encoding);
    let Some(raw) = raw else { return Ok(c) };
    if let Some(enabled) = raw.enabled {
        c.enabled = enabled;
    }
    if let Some(t) = raw.threshold {
        let max = max_payload(encoding) as u64;
        if !(MIN_THRESHOLD as u64..=max).contains(&t) {
            return Err(ConfigError::new(
                file,
                "aqw.claimCheck.threshold",
                format!(
                    "{t} is not between {MIN_THRESHOLD} and {max} bytes (the largest payload \
                     a message holds with messageEncoding {})",
                    encoding.as_str()
                ),
            ));
        }
        c.threshold = t as usize;
    }
    if let Some(name) = &raw.container {
        if !valid_container(name) {
            return Err(ConfigError::new(
                file,
                "aqw.claimCheck.container",
                format!(
                    "\"{}\" is not a Blob container name (3-63 lowercase letters, digits \
                     and single hyphens, starting with a letter or digit)",
                    aqw_core::scrub::one_line(name)
                ),
            ));
        }
        c.container = name.clone();
    }
    if let Some(max) = raw.max_bytes {
        let least = c.threshold as u64;
        if !(least..=MAX_BYTES_CAP).contains(&max) {
            return Err(ConfigError::new(
                file,
                "aqw.claimCheck.maxBytes",
                format!(
                    "{max} is not between the threshold ({least} bytes) and {MAX_BYTES_CAP} \
                     bytes (256 MiB)"
                ),
            ));
        }
        c.max_bytes = max;
    }
    Ok(c)
}

/// The Blob service's container naming rules.
fn valid_container(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(threshold: Option<u64>, container: Option<&str>) -> RawClaimCheck {
        RawClaimCheck {
            enabled: None,
            threshold,
            container: container.map(str::to_string),
            max_bytes: None,
        }
    }

    #[test]
    fn defaults_and_bounds() {
        let b64 = MessageEncoding::Base64;
        let c = validate("host.json", None, b64).unwrap();
        assert_eq!(
            (c.threshold, c.container.as_str()),
            (49_152, "aqw-payloads")
        );
        let c = validate("host.json", Some(&raw(Some(4096), Some("big-jobs"))), b64).unwrap();
        assert_eq!((c.threshold, c.container.as_str()), (4096, "big-jobs"));
        for bad in [Some(10), Some(49_153)] {
            let e = validate("host.json", Some(&raw(bad, None)), b64).unwrap_err();
            assert_eq!(e.field, "aqw.claimCheck.threshold");
        }
        assert!(validate("h", Some(&raw(Some(65_536), None)), MessageEncoding::None).is_ok());
        for bad in ["Big", "a--b", "-ab", "ab", "a_b"] {
            let e = validate("h", Some(&raw(None, Some(bad))), b64).unwrap_err();
            assert_eq!(e.field, "aqw.claimCheck.container", "{bad}");
        }
    }

    #[test]
    fn max_bytes_is_at_least_the_threshold_and_at_most_the_cap() {
        let b64 = MessageEncoding::Base64;
        let c = validate("host.json", None, b64).unwrap();
        assert_eq!(c.max_bytes, aqw_core::claim::DEFAULT_MAX_BYTES);
        let with = |threshold, max| RawClaimCheck {
            max_bytes: Some(max),
            ..raw(threshold, None)
        };
        for ok in [49_152, 1 << 20, MAX_BYTES_CAP] {
            assert_eq!(
                validate("h", Some(&with(None, ok)), b64).unwrap().max_bytes,
                ok
            );
        }
        assert!(validate("h", Some(&with(Some(4096), 4096)), b64).is_ok());
        for (threshold, bad) in [
            (None, 49_151),
            (Some(4096), 4095),
            (None, MAX_BYTES_CAP + 1),
            (None, 0),
        ] {
            let e = validate("h", Some(&with(threshold, bad)), b64).unwrap_err();
            assert_eq!(e.field, "aqw.claimCheck.maxBytes", "{bad}");
        }
    }
}
