using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Engines;

/// <summary>
/// Performs one loop pass's receives or sends. Each loop owns one engine; it is used only on that
/// loop's thread.
/// </summary>
internal abstract unsafe class BatchEngine : IDisposable
{
    /// <summary>
    /// The managed engine: one syscall per op on the calling thread. It holds no state, so unlike a
    /// loop's own engine any thread may use it (a pool thread's sends).
    /// </summary>
    public static BatchEngine CallingThread { get; } = new Managed();

    /// <summary>True when batches can go through Linux AIO io_submit.</summary>
    public abstract bool HasAio { get; }

    public abstract string Name { get; }

    /// <summary>Performs ops[0..count) and stores each op's result (bytes, or -errno).</summary>
    public abstract void Execute(int direction, bool useAio, IoOp* ops, int count);

    public abstract void Dispose();

    /// <summary>
    /// Creates the native engine when it is loadable and wanted, else the managed one.
    /// <paramref name="aioCapacity"/> &gt; 0 asks for an AIO context; <paramref name="aioError"/> is the
    /// errno of a failed io_setup (0 when it worked or was not asked for).
    /// </summary>
    public static BatchEngine Create(bool preferNative, int aioCapacity, out int aioError)
    {
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

        aioError = 0;
        return new Managed();
    }

    /// <summary>libktl_native.so: one P/Invoke per pass, readv/sendmsg per socket or one io_submit inside.</summary>
    private sealed class Native(nint handle) : BatchEngine
    {
        private nint _handle = handle;
        private readonly bool _hasAio = NativeEngine.ktl_engine_has_aio(handle) != 0;

        public override bool HasAio => _hasAio;

        public override string Name => "native";

        public override void Execute(int direction, bool useAio, IoOp* ops, int count)
            => _ = NativeEngine.ktl_batch(_handle, direction, useAio && _hasAio ? 1 : 0, ops, count);

        public override void Dispose()
        {
            nint handle = Interlocked.Exchange(ref _handle, 0);
            if (handle != 0)
            {
                NativeEngine.ktl_engine_destroy(handle);
            }
        }
    }

    /// <summary>The fallback: the same batch as one readv or sendmsg P/Invoke per socket.</summary>
    private sealed class Managed : BatchEngine
    {
        public override bool HasAio => false;

        public override string Name => "managed";

        public override void Execute(int direction, bool useAio, IoOp* ops, int count)
        {
            for (int i = 0; i < count; i++)
            {
                IoOp* op = ops + i;
                long rc;
                do
                {
                    rc = direction == NativeEngine.Receive
                        ? Errno.Check((long)LibC.readv(op->Fd, op->Iov, op->IovCount))
                        : Interop.Socket.Send(op->Fd, op->Iov, op->IovCount, zeroCopy: (op->Flags & NativeEngine.SendZeroCopy) != 0);
                }
                while (rc == -Errno.EINTR);
                op->Result = rc;
            }
        }

        public override void Dispose()
        {
        }
    }
}
