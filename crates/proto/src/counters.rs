//! The guest's SVM counters as one typed record, declared once for both sides.
//!
//! A completion carries six values, so the record travels in *pages*: the guest asks for
//! page `n` with [`Opcode::Counters`](crate::Opcode::Counters) (`args[0] = n`) and the host
//! answers with that page's values. The host fills a [`Counters`] and sends
//! [`Counters::page`]; the guest decodes each page with [`Counters::set_page`]. The fields,
//! their pages and their order are written only in the `paged_record!` declaration below.
//! The same declaration gives the host's atomic twin ([`AtomicCounters`]) and the record's
//! serde form (the control API's `counters`). The copy ledger follows the record: page [`LEDGER_PAGE`]` + i` is link `i` (see
//! [`LedgerEntry`]), [`Counters::ledger_links`] of them.

/// Declares a record sent as pages of six `u64`s. Each field is a `count` (monotonic: a
/// difference of two snapshots means something) or a `gauge` (a current value).
macro_rules! paged_record {
    (
        $(#[$m:meta])*
        $name:ident / $atomic:ident {
            $(
                page $p:literal {
                    $( $(#[$fm:meta])* $f:ident : $kind:ident ),* $(,)?
                }
            )*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            $( $( $(#[$fm])* pub $f: u64, )* )*
        }

        #[doc = concat!("The same fields as [`", stringify!($name), "`], as atomics a host adds \
            to from many threads; [`load`](Self::load) reads them into one record.")]
        #[derive(Debug, Default)]
        pub struct $atomic {
            $( $(
                #[doc = concat!("[`", stringify!($name), "::", stringify!($f), "`], counted.")]
                pub $f: std::sync::atomic::AtomicU64,
            )* )*
        }

        impl $atomic {
            /// Every field as it is now (each read on its own, `Relaxed`).
            pub fn load(&self) -> $name {
                $name {
                    $( $( $f: self.$f.load(std::sync::atomic::Ordering::Relaxed), )* )*
                }
            }
        }

        $( const _: () = assert!(<[&str]>::len(&[$(stringify!($f)),*]) <= 6, "six values a page"); )*

        impl $name {
            /// Number of pages the record takes.
            pub const PAGES: u64 = <[u64]>::len(&[$($p),*]) as u64;

            /// Every field's name, in wire order.
            pub const FIELDS: &'static [&'static str] = &[$($(stringify!($f)),*),*];

            /// The values of page `n`, `None` past the record.
            pub fn page(&self, n: u64) -> Option<[u64; 6]> {
                match n {
                    $(
                        $p => {
                            let vals: &[u64] = &[$(self.$f),*];
                            let mut out = [0u64; 6];
                            out[..vals.len()].copy_from_slice(vals);
                            Some(out)
                        }
                    )*
                    _ => None,
                }
            }

            /// Takes the values of page `n` (as [`page`](Self::page) made them); false past
            /// the record.
            pub fn set_page(&mut self, n: u64, values: &[u64; 6]) -> bool {
                match n {
                    $(
                        $p => {
                            let mut it = values.iter().copied();
                            $( self.$f = it.next().unwrap_or(0); )*
                            true
                        }
                    )*
                    _ => false,
                }
            }

            /// `self - earlier` for the counts (saturating), the gauges as they are now.
            pub fn since(&self, earlier: &Self) -> Self {
                Self {
                    $( $( $f: paged_record!(@since $kind, self.$f, earlier.$f), )* )*
                }
            }
        }
    };
    (@since count, $now:expr, $then:expr) => { $now.saturating_sub($then) };
    (@since gauge, $now:expr, $then:expr) => { $now };
}

paged_record!(
    /// One guest's SVM counters as kept by the host (the counts are monotonic: subtract two
    /// snapshots with [`Counters::since`]). The one declaration of them: the SVM manager
    /// counts into [`AtomicCounters`], the `Counters` request pages this record, and the
    /// control API serialises it (without the two gauges the request adds).
    Counters / AtomicCounters {
        page 0 {
            /// Coherence copies made for the guest.
            copies: count,
            /// Time those copies took.
            copy_ns: count,
            /// Copies a begin_access had to make on the spot.
            sync_fetches: count,
            /// begin_accesses that waited for a copy already in flight.
            inflight_waits: count,
            /// Copies the prefetcher started ahead of an access.
            prefetches: count,
            /// Accesses a prefetch had prepared.
            hits: count,
        }
        page 1 {
            /// Accesses the prefetcher had not foreseen.
            misses: count,
            /// Compensation the guest was asked to block for.
            compensation_ns: count,
            /// Time the host spent in its SVM bookkeeping.
            bookkeeping_ns: count,
            /// Bytes of the host's SVM bookkeeping for this guest (its predictor, its
            /// regions).
            #[serde(skip)]
            metadata_bytes: gauge,
        }
        page 2 {
            /// Bytes the coherence copies moved.
            copy_bytes: count,
            /// Copies of frame bytes that devices made in their own memory (outside
            /// coherence).
            device_copies: count,
            /// Bytes of those device copies.
            device_copy_bytes: count,
            /// Time of those device copies.
            device_copy_ns: count,
            /// Links of the copy ledger (pages [`LEDGER_PAGE`] on).
            #[serde(skip)]
            ledger_links: gauge,
        }
    }
);

/// The first ledger page of the `Counters` request: the pages after the record.
pub const LEDGER_PAGE: u64 = Counters::PAGES;

/// One link of a guest's copy ledger, one page of the `Counters` request from
/// [`LEDGER_PAGE`] on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Source memory domain.
    pub src: u32,
    /// Destination memory domain (equal to `src` for a device's own copies).
    pub dst: u32,
    /// Number of copies on the link.
    pub copies: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Time spent copying, in nanoseconds.
    pub ns: u64,
}

impl LedgerEntry {
    /// The page's values.
    pub fn to_values(&self) -> [u64; 6] {
        [
            self.src as u64,
            self.dst as u64,
            self.copies,
            self.bytes,
            self.ns,
            0,
        ]
    }

    /// Decodes a page; domains beyond 32 bits are cut (the host never sends them).
    pub fn from_values(v: &[u64; 6]) -> Self {
        LedgerEntry {
            src: v[0] as u32,
            dst: v[1] as u32,
            copies: v[2],
            bytes: v[3],
            ns: v[4],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_through_its_pages() {
        let mut c = Counters::default();
        for (i, v) in [
            &mut c.copies,
            &mut c.copy_ns,
            &mut c.sync_fetches,
            &mut c.inflight_waits,
            &mut c.prefetches,
            &mut c.hits,
            &mut c.misses,
            &mut c.compensation_ns,
            &mut c.bookkeeping_ns,
            &mut c.metadata_bytes,
            &mut c.copy_bytes,
            &mut c.device_copies,
            &mut c.device_copy_bytes,
            &mut c.device_copy_ns,
            &mut c.ledger_links,
        ]
        .into_iter()
        .enumerate()
        {
            *v = 100 + i as u64;
        }
        let mut back = Counters::default();
        for n in 0..Counters::PAGES {
            assert!(back.set_page(n, &c.page(n).unwrap()));
        }
        assert_eq!(back, c);
        assert_eq!(c.page(Counters::PAGES), None);
        assert!(!back.set_page(Counters::PAGES, &[0; 6]));
        assert_eq!(Counters::FIELDS.len(), 15);
    }

    /// The pages as the host has sent them since before the record was declared.
    #[test]
    fn the_wire_layout_is_kept() {
        let c = Counters {
            copies: 1,
            hits: 6,
            misses: 7,
            metadata_bytes: 10,
            copy_bytes: 11,
            ledger_links: 15,
            ..Counters::default()
        };
        assert_eq!(c.page(0), Some([1, 0, 0, 0, 0, 6]));
        assert_eq!(c.page(1), Some([7, 0, 0, 10, 0, 0]));
        assert_eq!(c.page(2), Some([11, 0, 0, 0, 15, 0]));
        assert_eq!(LEDGER_PAGE, 3);
    }

    #[test]
    fn since_subtracts_counts_and_keeps_gauges() {
        let then = Counters {
            copies: 5,
            metadata_bytes: 100,
            ledger_links: 2,
            ..Counters::default()
        };
        let now = Counters {
            copies: 8,
            metadata_bytes: 40,
            ledger_links: 3,
            ..Counters::default()
        };
        let d = now.since(&then);
        assert_eq!((d.copies, d.metadata_bytes, d.ledger_links), (3, 40, 3));
        assert_eq!(then.since(&now).copies, 0, "saturates");
    }

    /// The control API's `counters` object: the thirteen SVM counters, not the request's gauges.
    #[test]
    fn the_json_form_leaves_out_the_gauges() {
        let c = Counters {
            copies: 2,
            metadata_bytes: 9,
            ledger_links: 1,
            ..Counters::default()
        };
        let v = serde_json::to_value(c).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(keys.len(), 13, "{keys:?}");
        assert_eq!(v["copies"], 2);
        assert!(v.get("metadata_bytes").is_none() && v.get("ledger_links").is_none());
        let back: Counters = serde_json::from_value(v).unwrap();
        assert_eq!((back.copies, back.metadata_bytes), (2, 0));
    }

    #[test]
    fn the_atomic_twin_loads_every_field() {
        let a = AtomicCounters::default();
        a.copies.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        a.device_copy_ns
            .fetch_add(4, std::sync::atomic::Ordering::Relaxed);
        let c = a.load();
        assert_eq!((c.copies, c.device_copy_ns, c.hits), (3, 4, 0));
    }

    #[test]
    fn ledger_entries_round_trip() {
        let e = LedgerEntry {
            src: 1,
            dst: 4,
            copies: 2,
            bytes: 3,
            ns: 9,
        };
        assert_eq!(LedgerEntry::from_values(&e.to_values()), e);
    }
}
