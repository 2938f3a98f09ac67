using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>Performs a batch's ops: one P/Invoke for the whole batch (native), or one per op (managed).</summary>
internal abstract unsafe class BatchExecutor : IDisposable
{
    /// <summary>The managed executor: stateless, so any thread may use it (a pool thread's own sends).</summary>
    public static BatchExecutor CallingThread { get; } = new Managed();

    public abstract bool IsNative { get; }

    public abstract bool UsesAio { get; }

    /// <summary>Performs ops[0..count) and stores each op's result (bytes, or -errno).</summary>
    public abstract void Execute(IoDirection direction, IoOp* ops, int count);

    public abstract void Dispose();

    /// <summary>
    /// libktl_native.so when it loads (and <paramref name="preferNative"/>), with an AIO context of
    /// <paramref name="aioCapacity"/> requests when that is above 0; otherwise the managed executor.
    /// <paramref name="aioError"/> is the errno of a failed io_setup, 0 when it worked or was not asked for.
    /// </summary>
    public static BatchExecutor Create(bool preferNative, int aioCapacity, out int aioError)
    {
        aioError = 0;
        if (preferNative && NativeEngine.IsSupported)
        {
            int error = 0;
            nint handle = NativeEngine.ktl_engine_create(aioCapacity, &error);
            if (handle != 0)
            {
                aioError = error;
                return new Native(handle);
            }
        }

        return new Managed();
    }

    /// <summary>libktl_native.so: one P/Invoke per batch, readv/sendmsg per socket or one io_submit inside. Loop thread only.</summary>
    private sealed class Native(nint handle) : BatchExecutor
    {
        private readonly bool _hasAio = NativeEngine.ktl_engine_has_aio(handle) != 0;
        private nint _handle = handle;

        public override bool IsNative => true;

        public override bool UsesAio => _hasAio;

        public override void Execute(IoDirection direction, IoOp* ops, int count)
            => _ = NativeEngine.ktl_batch(_handle, (int)direction, _hasAio ? 1 : 0, ops, count);

        public override void Dispose()
        {
            nint handle = Interlocked.Exchange(ref _handle, 0);
            if (handle != 0)
            {
                NativeEngine.ktl_engine_destroy(handle);
            }
        }
    }

    /// <summary>The fallback: one readv or sendmsg P/Invoke per op. It holds no state, so any thread may use it.</summary>
    private sealed class Managed : BatchExecutor
    {
        public override bool IsNative => false;

        public override bool UsesAio => false;

        public override void Execute(IoDirection direction, IoOp* ops, int count)
        {
            for (int i = 0; i < count; i++)
            {
                IoOp* op = ops + i;
                SysResult result;
                do
                {
                    result = direction == IoDirection.Receive
                        ? LibC.ReadVector(op->Fd, op->Iov, op->IovCount)
                        : Interop.Socket.Send(op->Fd, op->Iov, op->IovCount, zeroCopy: (op->Flags & NativeEngine.SendZeroCopy) != 0);
                }
                while (result.Is(Errno.EINTR));
                op->Result = result.IsError ? -result.Error : result.Value;
            }
        }

        public override void Dispose()
        {
        }
    }
}
