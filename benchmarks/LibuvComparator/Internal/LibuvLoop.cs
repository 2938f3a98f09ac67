using System.Buffers;
using System.Collections.Concurrent;
using System.IO.Pipelines;
using System.Runtime.InteropServices;
using LibuvComparator.Interop;
using Microsoft.Extensions.Logging;

namespace LibuvComparator.Internal;

/// <summary>
/// One thread running one libuv loop: uv_run(UV_RUN_DEFAULT) until stopped. Other threads hand it
/// work through <see cref="Schedule"/>, a ConcurrentQueue drained by a uv_async_t callback. The loop
/// is the scheduler of the transport's side of every pipe it owns (input writer, output reader), so
/// a flush by the application wakes the loop, which then issues the uv_write.
/// </summary>
internal sealed unsafe class LibuvLoop : PipeScheduler, IUvHandleOwner
{
    /// <summary>
    /// At most this many segments go into one uv_write. uv_write copies the uv_buf_t array into the
    /// request (inline up to 4, malloc beyond: uv_write2 in src/unix/stream.c), so one scratch array
    /// per loop serves every connection. 64 segments of 4 KiB cover the 64 KiB MaxWriteBufferSize.
    /// </summary>
    public const int MaxWriteBuffers = 64;

    /// <summary>Work items run per wake-up before libuv polls I/O again, so a busy queue cannot starve sockets.</summary>
    private const int MaxWorkPerWakeUp = 1024;

    private const int Running = 0;
    private const int Stopping = 1;
    private const int Exited = 2;

    [ThreadStatic]
    private static LibuvLoop? t_current;

    private readonly ConcurrentQueue<ScheduledWork> _queue = new();
    private readonly TaskCompletionSource _stopped = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private readonly Thread _thread;
    private readonly bool _ownsPool;
    private readonly nint _loop;
    private readonly nint _async;
    private GCHandle _self;
    private int _state;
    private int _senders;
    private bool _draining;

    public LibuvLoop(int index, LibuvComparatorOptions options, MemoryPool<byte> pool, bool ownsPool, ILogger logger)
    {
        Index = index;
        Options = options;
        Pool = pool;
        Logger = logger;
        _ownsPool = ownsPool;

        _loop = (nint)NativeMemory.AllocZeroed(Uv.uv_loop_size());
        int rc = Uv.uv_loop_init(_loop);
        if (rc < 0)
        {
            NativeMemory.Free((void*)_loop);
            throw new InvalidOperationException($"uv_loop_init failed: {Uv.Describe(rc)}.");
        }

        _async = UvMemory.AllocateHandle(UvHandleType.Async);
        rc = Uv.uv_async_init(_loop, _async, &OnAsync);
        if (rc < 0)
        {
            UvMemory.Free(_async);
            _ = Uv.uv_loop_close(_loop);
            NativeMemory.Free((void*)_loop);
            throw new InvalidOperationException($"uv_async_init failed: {Uv.Describe(rc)}.");
        }

        _self = GCHandle.Alloc(this);
        Uv.uv_handle_set_data(_async, GCHandle.ToIntPtr(_self));
        WriteBuffers = (UvBuf*)NativeMemory.Alloc((nuint)(MaxWriteBuffers * sizeof(UvBuf)));

        // Computed once per loop. The transport's side of each pipe continues on this loop; the
        // application's side on the thread pool, as the libuv transport's default did.
        long maxRead = options.MaxReadBufferSize ?? 0;
        long maxWrite = options.MaxWriteBufferSize ?? 0;
        InputPipeOptions = new PipeOptions(pool, ThreadPool, this, maxRead, maxRead / 2, useSynchronizationContext: false);
        OutputPipeOptions = new PipeOptions(pool, this, ThreadPool, maxWrite, maxWrite / 2, useSynchronizationContext: false);

        _thread = new Thread(Run) { IsBackground = true, Name = $"libuv comparator loop {index}" };
    }

    public int Index { get; }

    public LibuvComparatorOptions Options { get; }

    public MemoryPool<byte> Pool { get; }

    public ILogger Logger { get; }

    /// <summary>The uv_loop_t.</summary>
    public nint Handle => _loop;

    /// <summary>Scratch uv_buf_t array for building one write (loop thread only).</summary>
    public UvBuf* WriteBuffers { get; }

    public PipeOptions InputPipeOptions { get; }

    public PipeOptions OutputPipeOptions { get; }

    /// <summary>True on this loop's thread while its loop still exists: only then may libuv be called.</summary>
    public bool IsOnLoopThread => t_current == this;

    /// <summary>True once the loop tears down: no new handles may be opened on it.</summary>
    public bool IsStopping => Volatile.Read(ref _state) != Running;

    /// <summary>Completes when the thread has closed every handle and freed the loop.</summary>
    public Task Stopped => _stopped.Task;

    public Thread Thread => _thread;

    public void Start() => _thread.Start();

    /// <summary>Thread-safe. uv_stop on the loop; the thread then closes every handle and exits.</summary>
    public void Stop() => Schedule(static s => Uv.uv_stop(((LibuvLoop)s!)._loop), this);

    /// <summary>Thread-safe. Runs <paramref name="action"/> on the loop thread (on the thread pool once the loop has exited).</summary>
    public override void Schedule(Action<object?> action, object? state)
    {
        _queue.Enqueue(new ScheduledWork(action, state));
        if (t_current == this)
        {
            // The drain in progress picks it up; otherwise this thread is inside another libuv callback.
            if (!_draining && _state == Running)
            {
                _ = Uv.uv_async_send(_async);
            }

            return;
        }

        // _senders lets the teardown wait until no other thread can still be inside uv_async_send
        // before it closes the async handle and frees the loop.
        Interlocked.Increment(ref _senders);
        int loopState = Volatile.Read(ref _state);
        if (loopState == Running)
        {
            // Fails only on a closed handle, which _senders rules out.
            _ = Uv.uv_async_send(_async);
        }

        Interlocked.Decrement(ref _senders);
        if (loopState == Exited)
        {
            DrainToThreadPool();
        }
    }

    [UnmanagedCallersOnly]
    private static void OnAsync(nint handle)
    {
        try
        {
            var loop = UvMemory.HandleOwner<LibuvLoop>(handle);
            loop.RunQueuedWork(MaxWorkPerWakeUp);
            if (!loop._queue.IsEmpty && loop._state == Running)
            {
                // Budget spent: come back after libuv has polled I/O once.
                _ = Uv.uv_async_send(loop._async);
            }
        }
        catch (Exception e)
        {
            // Nothing may unwind into libuv.
            LogCallbackFailure(e);
        }
    }

    private void RunQueuedWork(int budget)
    {
        _draining = true;
        while (budget-- > 0 && _queue.TryDequeue(out var work))
        {
            try
            {
                work.Run();
            }
            catch (Exception e)
            {
                ComparatorLog.CallbackFailed(Logger, Index, e);
            }
        }

        _draining = false;
    }

    private void Run()
    {
        t_current = this;
        try
        {
            // Returns after uv_stop: the async handle keeps the loop alive until then.
            _ = Uv.uv_run(_loop, UvRunMode.Default);
        }
        catch (Exception e)
        {
            // Callbacks catch their own exceptions; only a bug in the loop itself gets here.
            ComparatorLog.LoopFailed(Logger, Index, e);
        }
        finally
        {
            Teardown();
            t_current = null;
        }
    }

    private void Teardown()
    {
        Interlocked.Exchange(ref _state, Stopping);
        var spin = default(SpinWait);
        while (Volatile.Read(ref _senders) != 0)
        {
            spin.SpinOnce();
        }

        // Close every handle (connections are reset, listeners closed, the async handle too) and run
        // the loop until their close callbacks have run. Work that closing schedules onto this loop
        // (cancelled pipe reads and flushes) runs between passes.
        bool closed = false;
        for (int pass = 0; pass < 100 && !closed; pass++)
        {
            RunQueuedWork(int.MaxValue);
            Uv.uv_walk(_loop, &CloseWalk, 0);
            _ = Uv.uv_run(_loop, UvRunMode.Default);
            if (_queue.IsEmpty)
            {
                int rc = Uv.uv_loop_close(_loop);
                closed = rc == 0;
                if (!closed && pass == 99)
                {
                    ComparatorLog.LoopCloseFailed(Logger, Index, Uv.Describe(rc));
                }
            }
        }

        // From here on, work posted to this loop runs on the thread pool: it only completes pipes of
        // connections whose handles are closed.
        Volatile.Write(ref _state, Exited);
        DrainToThreadPool();

        NativeMemory.Free(WriteBuffers);
        if (closed)
        {
            NativeMemory.Free((void*)_loop);
        }

        if (_ownsPool)
        {
            Pool.Dispose();
        }

        ComparatorLog.LoopStopped(Logger, Index);
        _stopped.TrySetResult();
    }

    [UnmanagedCallersOnly]
    private static void CloseWalk(nint handle, nint arg)
    {
        try
        {
            if (Uv.uv_is_closing(handle) != 0)
            {
                return;
            }

            nint data = Uv.uv_handle_get_data(handle);
            if (data == 0)
            {
                Uv.uv_close(handle, &UvMemory.FreeOnClose);
            }
            else
            {
                ((IUvHandleOwner)GCHandle.FromIntPtr(data).Target!).CloseForLoopShutdown();
            }
        }
        catch (Exception e)
        {
            LogCallbackFailure(e);
        }
    }

    /// <summary>For exceptions caught at the native boundary that belong to no connection.</summary>
    public static void LogCallbackFailure(Exception e)
    {
        try
        {
            if (t_current is { } loop)
            {
                ComparatorLog.CallbackFailed(loop.Logger, loop.Index, e);
            }
        }
        catch (Exception)
        {
            // A failing logger must not unwind into libuv either.
        }
    }

    /// <summary>Closes the async handle (shutdown walk).</summary>
    void IUvHandleOwner.CloseForLoopShutdown() => Uv.uv_close(_async, &OnAsyncClosed);

    [UnmanagedCallersOnly]
    private static void OnAsyncClosed(nint handle)
    {
        var loop = UvMemory.HandleOwner<LibuvLoop>(handle);
        UvMemory.Free(handle);
        loop._self.Free();
    }

    private void DrainToThreadPool()
    {
        while (_queue.TryDequeue(out var work))
        {
            System.Threading.ThreadPool.UnsafeQueueUserWorkItem(static w => w.Run(), work, preferLocal: false);
        }
    }

    /// <summary>Waits for the thread to end (never from the loop thread itself).</summary>
    public void Join()
    {
        if (Thread.CurrentThread != _thread)
        {
            _thread.Join();
        }
    }

    /// <summary>A continuation and its state, queued without a closure.</summary>
    private readonly struct ScheduledWork(Action<object?> action, object? state)
    {
        public void Run() => action(state);
    }
}
