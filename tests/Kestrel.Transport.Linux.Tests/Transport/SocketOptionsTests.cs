using System.Buffers;
using System.Globalization;
using System.Net;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Tests.Infrastructure;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// The opt-in socket and thread options are really applied where they belong, read back from the
/// kernel (getsockopt, /proc), and a listener with TCP_DEFER_ACCEPT really holds back a silent
/// connection. Linux kinds only: Sockets has none of these options to compare with.
/// </summary>
public sealed class SocketOptionsTests(ITestOutputHelper output)
{
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task Accepted_sockets_carry_NOTSENT_LOWAT_BUSY_POLL_and_QUICKACK_when_asked(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output, s => s.Linux = o =>
        {
            o.Tuning.TcpNotSentLowAtBytes = 16384;
            o.BusyPollMicroseconds = 50;
            o.Tuning.TcpQuickAck = true;
        });
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = Assert.IsType<LinuxConnection>(await transport.AcceptAsync(listener));

        Assert.False(Interop.Socket.GetOption(connection.Fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_NOTSENT_LOWAT, out int lowAt).IsError);
        Assert.Equal(16384, lowAt);
        Assert.False(Interop.Socket.GetOption(connection.Fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_BUSY_POLL, out int busyPoll).IsError);
        Assert.Equal(50, busyPoll);

        // TCP_QUICKACK reads back as the current quick-ack state; after data has been received the
        // transport sets it again, so it is on after an echo round trip.
        await client.SendAllAsync("ping"u8.ToArray());
        var read = await connection.Transport.Input.ReadAsync().AsTask().WaitAsync(TestTimeouts.Default);
        connection.Transport.Input.AdvanceTo(read.Buffer.End);
        Assert.False(Interop.Socket.GetOption(connection.Fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_QUICKACK, out int quickAck).IsError);
        Assert.Equal(1, quickAck);
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task Without_the_options_accepted_sockets_keep_the_system_defaults(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var connection = Assert.IsType<LinuxConnection>(await transport.AcceptAsync(listener));

        // 0 is the socket's "not set": the system-wide net.ipv4.tcp_notsent_lowat applies.
        Assert.False(Interop.Socket.GetOption(connection.Fd, Interop.Socket.IPPROTO_TCP, Interop.Socket.TCP_NOTSENT_LOWAT, out int lowAt).IsError);
        Assert.Equal(0, lowAt);
        Assert.False(Interop.Socket.GetOption(connection.Fd, Interop.Socket.SOL_SOCKET, Interop.Socket.SO_BUSY_POLL, out int busyPoll).IsError);
        Assert.Equal(0, busyPoll);
        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task TcpDeferAccept_holds_back_a_silent_connection_until_its_first_bytes(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output, s =>
        {
            s.ThreadCount = 1;
            s.Linux = o => o.TcpDeferAcceptSeconds = 5;
        });
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));

        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        var accept = listener.AcceptAsync().AsTask();
        await Task.Delay(TimeSpan.FromMilliseconds(750));
        Assert.False(accept.IsCompleted, "A client that connected and sent nothing was accepted although TCP_DEFER_ACCEPT is set.");

        await client.SendAllAsync("x"u8.ToArray());
        var connection = await accept.WaitAsync(TestTimeouts.Default);
        Assert.NotNull(connection);
        transport.Track(connection);
        var read = await connection.Transport.Input.ReadAsync().AsTask().WaitAsync(TestTimeouts.Default);
        Assert.Equal("x"u8.ToArray(), read.Buffer.ToArray());
        connection.Transport.Input.AdvanceTo(read.Buffer.End);
        await transport.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task Without_TcpDeferAccept_a_silent_connection_is_accepted_at_once(TransportKind kind)
    {
        // The control for the test above: the same silent client, accepted without waiting for data.
        await using var transport = TestTransport.Create(kind, output, s => s.ThreadCount = 1);
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        using var client = await TestSockets.ConnectAsync(listener.EndPoint);
        await transport.AcceptAsync(listener, TimeSpan.FromMilliseconds(750 * 4));
        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task CpuAffinity_pins_each_loop_thread_to_its_own_allowed_cpu(TransportKind kind)
    {
        var allowed = Affinity.AllowedCpus(out var result);
        Assert.True(allowed.Count > 0, $"sched_getaffinity failed: {result}");
        await using var transport = TestTransport.Create(kind, output, s =>
        {
            s.ThreadCount = 3;
            s.Linux = o => o.CpuAffinity = true;
        });
        await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        var loops = ((LinuxTransportFactory)transport.Factory).Loops;
        Assert.Equal(3, loops.Count);
        foreach (var loop in loops)
        {
            Assert.NotEqual(0, loop.ThreadId);
            string cpus = CpusAllowedList(loop.ThreadId);
            output.WriteLine($"loop {loop.Index} (tid {loop.ThreadId}): Cpus_allowed_list {cpus}");
            Assert.Equal(allowed[loop.Index % allowed.Count].ToString(CultureInfo.InvariantCulture), cpus);
        }

        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task Without_CpuAffinity_loop_threads_keep_the_process_cpus(TransportKind kind)
    {
        string processCpus = CpusAllowedList(Environment.ProcessId);
        await using var transport = TestTransport.Create(kind, output);
        await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        foreach (var loop in ((LinuxTransportFactory)transport.Factory).Loops)
        {
            Assert.Equal(processCpus, CpusAllowedList(loop.ThreadId));
        }

        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [InlineData(true, 3)] // SCHED_BATCH
    [InlineData(false, 0)] // SCHED_OTHER, what .NET threads start with
    public async Task SchedBatchLoops_sets_the_loop_threads_scheduling_policy(bool schedBatch, int expectedPolicy)
    {
        await using var transport = TestTransport.Create(TransportKind.LinuxNative, output, s =>
        {
            s.ThreadCount = 2;
            s.Linux = o => o.Tuning.SchedBatchLoops = schedBatch;
        });
        await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        foreach (var loop in ((LinuxTransportFactory)transport.Factory).Loops)
        {
            Assert.NotEqual(0, loop.ThreadId);
            Assert.Equal(expectedPolicy, SchedulingPolicy(loop.ThreadId));
        }

        // Only the loops: the app's pool threads keep the process's policy.
        Assert.Equal(0, SchedulingPolicy(Affinity.CurrentThreadId()));
        await transport.StopAsync(expectRentals: false);
    }

    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task BusyPoll_sets_the_epoll_busy_poll_parameters_where_the_kernel_has_them(TransportKind kind)
    {
        await using var transport = TestTransport.Create(kind, output, s => s.Linux = o => o.BusyPollMicroseconds = 75);
        await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        foreach (var loop in ((LinuxTransportFactory)transport.Factory).Loops)
        {
            if (!KernelFeatures.SocketsHere.EpollBusyPollParameters)
            {
                // Linux < 6.9: nothing to read back; the loop logged the refusal and runs on.
                output.WriteLine("This kernel has no epoll busy-poll parameters; only SO_BUSY_POLL applies.");
                continue;
            }

            Assert.False(Epoll.GetBusyPollParameters(((EpollEngine)loop.Engine).EpollFd, out ulong parameters).IsError);
            Assert.Equal(75u, (uint)(parameters & 0xFFFFFFFF));
        }

        await transport.StopAsync(expectRentals: false);
    }

    /// <summary>The policy field of /proc/self/task/TID/stat (proc(5), field 41), after the parenthesised command name.</summary>
    private static int SchedulingPolicy(int tid)
    {
        string stat = File.ReadAllText($"/proc/self/task/{tid}/stat");
        string[] fields = stat[(stat.LastIndexOf(')') + 2)..].Split(' ');
        return int.Parse(fields[41 - 3], CultureInfo.InvariantCulture);
    }

    private static string CpusAllowedList(int tid)
    {
        string status = File.ReadAllText($"/proc/self/task/{tid}/status");
        return status.Split('\n').Single(l => l.StartsWith("Cpus_allowed_list:", StringComparison.Ordinal))["Cpus_allowed_list:".Length..].Trim();
    }
}
