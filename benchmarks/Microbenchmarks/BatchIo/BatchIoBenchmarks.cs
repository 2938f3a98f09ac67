using System.Runtime.InteropServices;
using BenchmarkDotNet.Attributes;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Microbenchmarks.BatchIo;

public enum EngineKind
{
    /// <summary>libktl_native.so: one P/Invoke per batch, readv/sendmsg per socket inside it.</summary>
    Native,

    /// <summary>The managed fallback: one readv or sendmsg P/Invoke per socket.</summary>
    Managed,

    /// <summary>libktl_native.so with a Linux AIO context: one io_submit per batch.</summary>
    NativeAio,
}

/// <summary>
/// One event-loop pass's receives (or sends) over <see cref="Sockets"/> sockets, each with 64 bytes to move,
/// done by each engine. One operation is one whole batch; divide by Sockets for the cost per socket.
/// </summary>
/// <remarks>
/// Every measured call moves real bytes, never EAGAIN: before each iteration the peers are drained and, for
/// receives, each is given <see cref="RoundsPerIteration"/> chunks at once, exactly what the iteration's
/// invocations consume, one chunk per socket per call. Each op's result is checked, so a call that moved
/// nothing fails the benchmark. The setup runs outside the measurement, which is why the invocation count is
/// fixed instead of chosen by the pilot stage.
/// </remarks>
[BenchmarkCategory("BatchIo")]
[InvocationCount(RoundsPerIteration)]
public unsafe class BatchIoBenchmarks
{
    public const int RoundsPerIteration = 128;
    public const int ChunkBytes = 64;

    // Written into every op's result before each call, so an engine that skipped an op cannot pass for one
    // that moved its 64 bytes.
    private const long NotPerformed = long.MinValue;

    private SocketPairs? _pairs;
    private BatchExecutor? _engine;
    private IoOp* _ops;
    private Iovec* _iov;
    private byte* _buffers;
    private byte[] _refill = [];
    private byte[] _scratch = [];

    [ParamsSource(nameof(Engines))]
    public EngineKind Engine { get; set; }

    [ParamsSource(nameof(SocketCounts))]
    public int Sockets { get; set; }

    [ParamsSource(nameof(SocketKinds))]
    public SocketKind Kind { get; set; }

    public static IEnumerable<EngineKind> Engines => [EngineKind.Native, EngineKind.Managed, EngineKind.NativeAio];

    public static IEnumerable<int> SocketCounts => SuiteScope.Quick ? [16] : [1, 16, 256];

    public static IEnumerable<SocketKind> SocketKinds => [SocketKind.UnixStream, SocketKind.TcpLoopback];

    [GlobalSetup]
    public void Setup()
    {
        _engine = CreateEngine(Engine, Sockets);
        _pairs = SocketPairs.Create(Kind, Sockets);

        _buffers = (byte*)NativeMemory.AllocZeroed((nuint)(Sockets * ChunkBytes));
        _iov = (Iovec*)NativeMemory.AllocZeroed((nuint)(Sockets * sizeof(Iovec)));
        _ops = (IoOp*)NativeMemory.AllocZeroed((nuint)(Sockets * sizeof(IoOp)));
        for (int i = 0; i < Sockets; i++)
        {
            _iov[i].Base = _buffers + (i * ChunkBytes);
            _iov[i].Length = ChunkBytes;
            _ops[i].Fd = _pairs.Local[i];
            _ops[i].IovCount = 1;
            _ops[i].Iov = _iov + i;
            _ops[i].Result = NotPerformed;
        }

        _refill = new byte[RoundsPerIteration * ChunkBytes];
        _refill.AsSpan().Fill((byte)'r');
        _scratch = new byte[64 * 1024];
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        _engine?.Dispose();
        _pairs?.Dispose();
        NativeMemory.Free(_ops);
        NativeMemory.Free(_iov);
        NativeMemory.Free(_buffers);
        _ops = null;
        _iov = null;
        _buffers = null;
    }

    [IterationSetup(Target = nameof(Receive))]
    public void FillForReceive()
    {
        var pairs = _pairs!;
        for (int i = 0; i < Sockets; i++)
        {
            SocketCalls.Drain(pairs.Local[i], _scratch);
            SocketCalls.WriteAll(pairs.Remote[i], _refill);
        }
    }

    [IterationSetup(Target = nameof(Send))]
    public void DrainForSend()
    {
        var pairs = _pairs!;
        for (int i = 0; i < Sockets; i++)
        {
            SocketCalls.Drain(pairs.Remote[i], _scratch);
        }
    }

    [Benchmark]
    public void Receive()
    {
        _engine!.Execute(IoDirection.Receive, _ops, Sockets);
        EnsureEveryOpMovedAChunk("receive");
    }

    [Benchmark]
    public void Send()
    {
        _engine!.Execute(IoDirection.Send, _ops, Sockets);
        EnsureEveryOpMovedAChunk("send");
    }

    private void EnsureEveryOpMovedAChunk(string direction)
    {
        for (int i = 0; i < Sockets; i++)
        {
            if (_ops[i].Result != ChunkBytes)
            {
                Fail(direction, i, _ops[i].Result);
            }

            _ops[i].Result = NotPerformed;
        }
    }

    private static void Fail(string direction, int index, long result)
        => throw new InvalidOperationException(
            $"{direction} on socket {index} returned {Describe(result)}, expected {ChunkBytes} bytes.");

    private static string Describe(long result) => result switch
    {
        NotPerformed => "no result (the engine did not perform the op)",
        < 0 => $"{Marshal.GetPInvokeErrorMessage((int)-result)} (errno {-result})",
        _ => $"{result} bytes",
    };

    /// <summary>Creates the engine the case names, or throws: a silent fallback would measure the wrong engine.</summary>
    private static BatchExecutor CreateEngine(EngineKind kind, int sockets)
    {
        var engine = BatchExecutor.Create(preferNative: kind != EngineKind.Managed, aioCapacity: kind == EngineKind.NativeAio ? sockets : 0, out int aioError);
        string? problem = kind switch
        {
            EngineKind.Managed when engine.IsNative => "expected the managed engine, got the native one",
            EngineKind.Native or EngineKind.NativeAio when !engine.IsNative => $"libktl_native.so is not in use: {NativeEngine.LoadError}",
            EngineKind.NativeAio when !engine.UsesAio => $"io_setup failed: {Marshal.GetPInvokeErrorMessage(aioError)} (errno {aioError})",
            _ => null,
        };

        if (problem is not null)
        {
            engine.Dispose();
            throw new InvalidOperationException($"{kind}: {problem}");
        }

        return engine;
    }
}
