//! The at-most-once terms of a ResourceSlice ([`AtMostOnce`]) as both sides read them: what
//! a provider agrees to of a request ([`Bounds`], [`agree`]: its negotiation answers with
//! that), and how several slices with one provider add up ([`strictest`] for the provider,
//! which enforces them, [`most_patient`] for the consumer, which waits them out). Here, with
//! the type, because negotiation and offloading both read the terms and neither depends on
//! the other.
use std::time::Duration;

use super::v1alpha1::AtMostOnce;

/// What the provider accepts of at-most-once requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Off: requests are not agreed to (the pods keep running through partitions).
    pub enabled: bool,
    /// A shorter partition time is raised to this: the heartbeat needs a few renewals'
    /// room, or a slow API server would stop healthy workloads.
    pub min_partition_seconds: u32,
    /// A longer grace period is lowered to this.
    pub max_grace_seconds: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            enabled: true,
            min_partition_seconds: 5,
            max_grace_seconds: 30,
        }
    }
}

/// Bounds that cannot be agreed to as given.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BoundsError {
    #[error("the shortest partition time must be whole seconds from 1 s to 1 day, not {0:?}")]
    MinPartition(Duration),
    #[error("the longest grace period must be whole seconds up to 1 hour, not {0:?}")]
    MaxGrace(Duration),
}

impl Bounds {
    /// On, with `min_partition` and `max_grace` (the ResourceSlice's ranges: a partition
    /// time of 1 s to 1 day, a grace period of at most 1 hour).
    pub fn new(min_partition: Duration, max_grace: Duration) -> Result<Self, BoundsError> {
        let whole = |d: Duration, max: u64| {
            (d.subsec_nanos() == 0 && d.as_secs() <= max).then_some(d.as_secs() as u32)
        };
        let min_partition_seconds = whole(min_partition, AtMostOnce::MAX_PARTITION_SECONDS.into())
            .filter(|s| *s >= AtMostOnce::MIN_PARTITION_SECONDS)
            .ok_or(BoundsError::MinPartition(min_partition))?;
        let max_grace_seconds = whole(max_grace, AtMostOnce::MAX_GRACE_SECONDS.into())
            .ok_or(BoundsError::MaxGrace(max_grace))?;
        Ok(Self {
            enabled: true,
            min_partition_seconds,
            max_grace_seconds,
        })
    }
}

/// What the provider agrees to for a slice asking `asked`: the request within its bounds.
pub fn agree(asked: Option<AtMostOnce>, bounds: &Bounds) -> Option<AtMostOnce> {
    let a = asked.filter(|_| bounds.enabled)?;
    Some(AtMostOnce {
        partition_seconds: a.partition_seconds.max(bounds.min_partition_seconds).max(1),
        grace_seconds: a.grace_seconds.min(bounds.max_grace_seconds),
    })
}

/// Several slices with one provider: the consumer waits for the longest agreed terms, the
/// provider stops after the shortest, so each side errs on the safe side.
pub fn strictest<'a>(terms: impl IntoIterator<Item = &'a AtMostOnce>) -> Option<AtMostOnce> {
    terms.into_iter().fold(None, |acc: Option<AtMostOnce>, t| {
        Some(match acc {
            None => *t,
            Some(a) => AtMostOnce {
                partition_seconds: a.partition_seconds.min(t.partition_seconds),
                grace_seconds: a.grace_seconds.min(t.grace_seconds),
            },
        })
    })
}

/// The longest of several agreed terms (the consumer's side of [`strictest`]).
pub fn most_patient<'a>(terms: impl IntoIterator<Item = &'a AtMostOnce>) -> Option<AtMostOnce> {
    terms.into_iter().fold(None, |acc: Option<AtMostOnce>, t| {
        Some(match acc {
            None => *t,
            Some(a) => AtMostOnce {
                partition_seconds: a.partition_seconds.max(t.partition_seconds),
                grace_seconds: a.grace_seconds.max(t.grace_seconds),
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn t(partition_seconds: u32, grace_seconds: u32) -> AtMostOnce {
        AtMostOnce {
            partition_seconds,
            grace_seconds,
        }
    }

    #[test]
    fn the_provider_agrees_within_its_bounds_or_not_at_all() {
        let b = Bounds::default();
        assert_eq!(agree(None, &b), None);
        assert_eq!(agree(Some(t(60, 10)), &b), Some(t(60, 10)));
        assert_eq!(agree(Some(t(1, 600)), &b), Some(t(5, 30)));
        let off = Bounds {
            enabled: false,
            ..b
        };
        assert_eq!(agree(Some(t(60, 10)), &off), None);
    }

    #[test]
    fn each_side_errs_on_the_safe_side_across_slices() {
        let terms = [t(30, 5), t(10, 20)];
        assert_eq!(strictest(&terms), Some(t(10, 5)));
        assert_eq!(most_patient(&terms), Some(t(30, 20)));
        assert_eq!(strictest(&[]), None);
    }

    #[test]
    fn bounds_from_the_command_line() {
        let secs = Duration::from_secs;
        let b = Bounds::new(secs(10), secs(5)).unwrap();
        assert_eq!(
            (b.enabled, b.min_partition_seconds, b.max_grace_seconds),
            (true, 10, 5)
        );
        assert_eq!(Bounds::new(secs(5), secs(30)), Ok(Bounds::default()));
        assert_eq!(Bounds::new(secs(1), secs(0)).unwrap().max_grace_seconds, 0);
        for (p, g) in [
            (secs(0), secs(30)),
            (Duration::from_millis(1500), secs(30)),
            (secs(86_401), secs(30)),
        ] {
            assert_eq!(Bounds::new(p, g), Err(BoundsError::MinPartition(p)));
        }
        for g in [secs(3601), Duration::from_millis(500)] {
            assert_eq!(Bounds::new(secs(5), g), Err(BoundsError::MaxGrace(g)));
        }
        // What the provider then agrees to.
        let b = Bounds::new(secs(20), secs(3)).unwrap();
        assert_eq!(
            agree(
                Some(AtMostOnce {
                    partition_seconds: 10,
                    grace_seconds: 10
                }),
                &b
            ),
            Some(AtMostOnce {
                partition_seconds: 20,
                grace_seconds: 3
            })
        );
    }
}
