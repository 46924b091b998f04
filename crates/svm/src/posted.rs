//! Posted CPU writes ([`SvmManager::posted_write`]): the guest writes its window first and
//! asks for the write to be begun and ended in one request, where the region's state shows
//! that nothing can have landed on its bytes meanwhile.

use crate::domain::DomainId;
use crate::region::RegionCtx;
use crate::{AccessSpec, EndReport, GuestId, RegionId, Result, SvmError, SvmManager};
use virtsoc_proto::AccessMode;

impl SvmManager {
    /// A posted CPU write: the guest has written `spec`'s range in its window without a
    /// begin_access, and the write is begun and ended here at once (one request, no round
    /// trip before the bytes). Accepted while no device has written the region since the
    /// guest's CPU did (so no copy into the window can have landed on the guest's bytes) and
    /// no copy into the window is in flight. Otherwise, where another replica holds the
    /// range's current contents, it is refused (`BadArgument`) and nothing is published: the
    /// window's range is marked stale, so what the guest wrote there is never read as the
    /// region's (a CPU read fetches the current bytes back); the guest writes again after a
    /// begin_access. Where the window held the only copy of the range, the guest's bytes
    /// replaced it whatever the host does, and the write is taken.
    pub fn posted_write(
        &self,
        guest: GuestId,
        id: RegionId,
        spec: &AccessSpec,
    ) -> Result<EndReport> {
        if spec.domain != DomainId::GUEST_WINDOW || spec.mode != AccessMode::Write {
            return Err(SvmError::BadArgument(
                "a posted write is a CPU write access".into(),
            ));
        }
        let region = self.region(guest.0, id.0)?;
        let range = Self::range_of(&region.meta, spec)?;
        {
            let mut st = region.lock();
            let window = DomainId::GUEST_WINDOW;
            let copying = st.inflight.contains_key(&window);
            if copying || (st.written && !st.cpu_wrote_last) {
                let cx = RegionCtx::new(&region, &mut st, &self.engine);
                let elsewhere = cx.valid_domains_in(range).iter().any(|d| *d != window);
                if copying || elsewhere {
                    if let Some(r) = st.replicas.get_mut(&window) {
                        r.stale.insert(range);
                    }
                    return Err(SvmError::BadArgument(
                        "posted write: a device wrote the region since the CPU did; \
                         begin_access first"
                            .into(),
                    ));
                }
            }
        }
        self.begin_access(guest, id, spec)?;
        self.end_access(guest, id, spec)
    }
}
