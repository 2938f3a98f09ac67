using System.Net;
using System.Runtime.InteropServices;
using LibuvComparator.Interop;
using Microsoft.AspNetCore.Connections;

namespace LibuvComparator.Internal;

/// <summary>
/// One loop's listening uv_tcp_t: adopts a bound SO_REUSEPORT socket (uv_tcp_open), listens, and
/// turns each accepted socket into a <see cref="LibuvConnection"/> on this loop.
/// </summary>
internal sealed unsafe class LoopListener : IUvHandleOwner
{
    private const int SockAddrStorageSize = SockAddr.StorageSize;

    private readonly LibuvConnectionListener _listener;
    private readonly LibuvLoop _loop;
    private readonly int _fd;
    private readonly int _backlog;
    private nint _handle;
    private GCHandle _self;
    private bool _closing;

    public LoopListener(LibuvConnectionListener listener, LibuvLoop loop, int fd, int backlog)
    {
        _listener = listener;
        _loop = loop;
        _fd = fd;
        _backlog = backlog;
    }

    public TaskCompletionSource Started { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

    public TaskCompletionSource Closed { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

    /// <summary>Thread-safe.</summary>
    public void Start() => _loop.Schedule(static s => ((LoopListener)s!).StartOnLoop(), this);

    /// <summary>Thread-safe; <see cref="Closed"/> completes once the handle is closed.</summary>
    public void Stop() => _loop.Schedule(static s => ((LoopListener)s!).CloseOnLoop(), this);

    private void StartOnLoop()
    {
        if (!_loop.IsOnLoopThread || _loop.IsStopping)
        {
            ListenSocket.CloseUnadopted(_fd);
            Started.TrySetException(new ObjectDisposedException(nameof(LibuvLoop), "The libuv loop is stopping."));
            Closed.TrySetResult();
            return;
        }

        _handle = UvMemory.AllocateHandle(UvHandleType.Tcp);
        int rc = Uv.uv_tcp_init(_loop.Handle, _handle);
        if (rc < 0)
        {
            UvMemory.Free(_handle);
            _handle = 0;
            ListenSocket.CloseUnadopted(_fd);
            Fail("uv_tcp_init", rc);
            return;
        }

        _self = GCHandle.Alloc(this);
        Uv.uv_handle_set_data(_handle, GCHandle.ToIntPtr(_self));

        rc = Uv.uv_tcp_open(_handle, _fd);
        if (rc < 0)
        {
            ListenSocket.CloseUnadopted(_fd);
            CloseOnLoop();
            Fail("uv_tcp_open", rc);
            return;
        }

        // From here the handle owns the fd: uv_close closes it.
        rc = Uv.uv_listen(_handle, _backlog, &OnConnection);
        if (rc < 0)
        {
            CloseOnLoop();
            Fail("uv_listen", rc);
            return;
        }

        Started.TrySetResult();
    }

    private void Fail(string call, int rc)
        => Started.TrySetException(new InvalidOperationException($"{call} for {_listener.EndPoint} failed on loop {_loop.Index}: {Uv.Describe(rc)}."));

    private void CloseOnLoop()
    {
        if (_closing)
        {
            return;
        }

        if (_handle == 0 || !_loop.IsOnLoopThread)
        {
            // Never started, or the loop's shutdown walk has closed the handle already.
            Closed.TrySetResult();
            return;
        }

        _closing = true;
        Uv.uv_close(_handle, &OnClosed);
    }

    void IUvHandleOwner.CloseForLoopShutdown() => CloseOnLoop();

    [UnmanagedCallersOnly]
    private static void OnClosed(nint handle)
    {
        try
        {
            var owner = UvMemory.HandleOwner<LoopListener>(handle);
            UvMemory.Free(handle);
            owner._handle = 0;
            owner._self.Free();
            owner.Started.TrySetException(new ObjectDisposedException(nameof(LoopListener)));
            owner.Closed.TrySetResult();
        }
        catch (Exception e)
        {
            LibuvLoop.LogCallbackFailure(e);
        }
    }

    [UnmanagedCallersOnly]
    private static void OnConnection(nint server, int status)
    {
        try
        {
            UvMemory.HandleOwner<LoopListener>(server).Accept(status);
        }
        catch (Exception e)
        {
            LibuvLoop.LogCallbackFailure(e);
        }
    }

    private void Accept(int status)
    {
        if (status < 0)
        {
            // libuv itself handles EMFILE (it keeps a reserve fd to accept and drop); anything else
            // is logged and the listener stays up.
            ComparatorLog.AcceptFailed(_loop.Logger, _loop.Index, _listener.EndPoint, Uv.Describe(status));
            return;
        }

        nint client = UvMemory.AllocateHandle(UvHandleType.Tcp);
        int rc = Uv.uv_tcp_init(_loop.Handle, client);
        if (rc < 0)
        {
            UvMemory.Free(client);
            ComparatorLog.AcceptFailed(_loop.Logger, _loop.Index, _listener.EndPoint, Uv.Describe(rc));
            return;
        }

        rc = Uv.uv_accept(_handle, client);
        if (rc < 0 || _closing)
        {
            Uv.uv_close(client, &UvMemory.FreeOnClose);
            if (rc < 0)
            {
                ComparatorLog.AcceptFailed(_loop.Logger, _loop.Index, _listener.EndPoint, Uv.Describe(rc));
            }

            return;
        }

        if (_loop.Options.NoDelay)
        {
            _ = Uv.uv_tcp_nodelay(client, 1);
        }

        LibuvConnection connection;
        try
        {
            connection = new LibuvConnection(_loop, client, Address(client, local: true) ?? _listener.EndPoint, Address(client, local: false));
        }
        catch
        {
            Uv.uv_close(client, &UvMemory.FreeOnClose);
            throw;
        }

        connection.Start();
        if (!_listener.Offer(connection))
        {
            connection.AbortOnLoop(new ConnectionAbortedException("The listener was unbound before the connection was accepted."));
        }
    }

    private static IPEndPoint? Address(nint tcp, bool local)
    {
        byte* address = stackalloc byte[SockAddrStorageSize];
        int length = SockAddrStorageSize;
        int rc = local ? Uv.uv_tcp_getsockname(tcp, address, &length) : Uv.uv_tcp_getpeername(tcp, address, &length);
        return rc < 0 ? null : SockAddr.Read(new ReadOnlySpan<byte>(address, length));
    }
}
