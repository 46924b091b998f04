//! Posted CPU writes ([`SvmManager::posted_write`]): the guest writes its window first and
//! asks for the write to be begun and ended in one request, where the region's state shows
//! that nothing can have landed on its bytes meanwhile.

use crate::domain::DomainId;
use crate::{AccessSpec, EndReport, GuestId, RegionId, Result, SvmError, SvmManager};
use virtsoc_proto::AccessMode;

impl SvmManager {
    /// A posted CPU write: the guest has written `spec`'s range in its window without a
    /// begin_access, and the write is begun and ended here at once (one request, no round
    /// trip before the bytes). Accepted only while the guest's CPU wrote the region last (no
    /// device has written it since, so no copy into the window can have landed on the
    /// guest's bytes) and no copy into the window is in flight; else `BadArgument` and
    /// nothing is published: the guest writes again after a begin_access.
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
        {
            let st = region.lock();
            if !st.cpu_wrote_last || st.inflight.contains_key(&DomainId::GUEST_WINDOW) {
                return Err(SvmError::BadArgument(
                    "posted write: a device wrote the region since the CPU did; \
                     begin_access first"
                        .into(),
                ));
            }
        }
        self.begin_access(guest, id, spec)?;
        self.end_access(guest, id, spec)
    }
}
