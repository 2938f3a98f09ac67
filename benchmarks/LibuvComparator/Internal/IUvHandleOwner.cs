namespace LibuvComparator.Internal;

/// <summary>
/// The managed object behind a libuv handle's <c>data</c> field (a GCHandle). When a loop stops it
/// walks its handles (uv_walk) and asks each owner to close its handle with its own close callback,
/// so that every owner frees its native memory and GCHandle in one place.
/// </summary>
internal interface IUvHandleOwner
{
    /// <summary>Closes the handle now (loop thread only); called at most once per handle by the loop's shutdown walk.</summary>
    void CloseForLoopShutdown();
}
