using System.Text;
using BenchmarkDotNet.Attributes;

namespace Kestrel.Transport.Linux.Microbenchmarks.Http;

/// <summary>
/// Pipelined keep-alive HTTP/1.1 against an in-process Kestrel: each operation sends <see cref="Depth"/>
/// requests back to back on each of <see cref="Connections"/> connections, then reads every response back and
/// checks it. Results are per request (OperationsPerInvoke), so Allocated is bytes per request and
/// Completed Work Items is thread-pool hops per request, server side.
/// </summary>
[BenchmarkCategory("Http")]
[SupportedSchedulingOnly]
public class HttpPipelineBenchmarks
{
    public const int Connections = 4;
    public const int Depth = 16;
    private const int RequestsPerOperation = Connections * Depth;

    private HelloWorldServer? _server;
    private PipelinedConnection[] _connections = [];
    private Workload _plaintext = null!;
    private Workload _json = null!;

    [ParamsSource(nameof(Transports))]
    public TransportKind Transport { get; set; }

    [ParamsSource(nameof(ThreadCounts))]
    public int ThreadCount { get; set; }

    [ParamsSource(nameof(SchedulingModes))]
    public SchedulingMode Scheduling { get; set; }

    // Libuv stays in the quick job too (at ThreadCount 1, ThreadPool), so CI's smoke run proves it starts and answers.
    public static IEnumerable<TransportKind> Transports => SuiteScope.LibuvAvailable
        ? [TransportKind.Sockets, TransportKind.Linux, TransportKind.Libuv]
        : [TransportKind.Sockets, TransportKind.Linux];

    public static IEnumerable<int> ThreadCounts => SuiteScope.Quick ? [1] : [1, 2, 4];

    public static IEnumerable<SchedulingMode> SchedulingModes
        => SuiteScope.Quick ? [SchedulingMode.ThreadPool] : [SchedulingMode.ThreadPool, SchedulingMode.Inline];

    [GlobalSetup]
    public void Setup()
    {
        _server = HelloWorldServer.StartAsync(Transport, ThreadCount, Scheduling).GetAwaiter().GetResult();
        _plaintext = new Workload(HelloWorldApp.PlaintextPath, ExpectedResponse.Plaintext);
        _json = new Workload(HelloWorldApp.JsonPath, ExpectedResponse.Json);

        int capacity = Depth * Math.Max(_plaintext.Expected.Length, _json.Expected.Length);
        _connections = new PipelinedConnection[Connections];
        for (int i = 0; i < _connections.Length; i++)
        {
            _connections[i] = new PipelinedConnection(_server.EndPoint, capacity);
        }

        // Fail here, with the server's actual bytes in the message, rather than in the middle of a measurement.
        Run(_plaintext);
        Run(_json);
    }

    [GlobalCleanup]
    public void Cleanup()
    {
        foreach (var connection in _connections)
        {
            connection.Dispose();
        }

        _server?.DisposeAsync().AsTask().GetAwaiter().GetResult();
    }

    [Benchmark(OperationsPerInvoke = RequestsPerOperation)]
    public void Plaintext() => Run(_plaintext);

    [Benchmark(OperationsPerInvoke = RequestsPerOperation)]
    public void Json() => Run(_json);

    private void Run(Workload workload)
    {
        // Every connection's batch goes out before any is read, so the server has all of them in flight at
        // once; a batch (under 1 KB of requests, 2.1 or 2.4 KB of responses) fits the socket buffers either way,
        // so the blocking sends cannot deadlock against unread responses.
        foreach (var connection in _connections)
        {
            connection.Send(workload.Requests);
        }

        foreach (var connection in _connections)
        {
            connection.ReceiveExactly(workload.ResponseBytes);
            workload.Expected.Verify(connection.Received, Depth);
        }
    }

    private sealed class Workload(string path, ExpectedResponse expected)
    {
        public byte[] Requests { get; } = Encoding.ASCII.GetBytes(
            string.Concat(Enumerable.Repeat($"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n", Depth)));

        public ExpectedResponse Expected { get; } = expected;

        public int ResponseBytes { get; } = Depth * expected.Length;
    }
}
