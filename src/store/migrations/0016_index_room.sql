-- Room in the leaves of the two indexes that the update finishing a request writes to
-- again. That update changes `status` (in the claim index's predicate), so it is never
-- HOT: it puts a second entry for the same key, pointing at the new version, into the
-- primary key and the by-workflow index. Ids grow at the right edge, and a rightmost
-- leaf split leaves the old leaf 90 % full by default, so those second entries arrived
-- at full leaves, each full leaf paying a bottom-up deletion pass (a visit to the heap
-- of every duplicate on it) to make room. With 50 a leaf holds its requests' first and
-- second entries. Applies to leaves split from now on.
ALTER INDEX service_requests_pkey SET (fillfactor = 50);
ALTER INDEX service_requests_by_workflow SET (fillfactor = 50);
