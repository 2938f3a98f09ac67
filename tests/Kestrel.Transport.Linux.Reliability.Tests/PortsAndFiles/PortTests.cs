using System.Globalization;
using System.Net;
using System.Text;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Reliability.Tests.PortsAndFiles;

/// <summary>
/// Whole Kestrel hosts competing for one port, and a port reused at once after its server stopped.
/// ListenerTests covers one transport binding twice at the transport level; these go through Kestrel's
/// address binding, mix the transports, and check where every later connection lands.
/// </summary>
public sealed class PortTests(ITestOutputHelper output)
{
    public static TheoryData<TransportKind, TransportKind> Pairs =>
        new()
        {
            { TransportKind.Sockets, TransportKind.Sockets },
            { TransportKind.LinuxNative, TransportKind.LinuxNative },
            { TransportKind.LinuxIoUring, TransportKind.LinuxIoUring },
            { TransportKind.LinuxManaged, TransportKind.LinuxNative },
            { TransportKind.LinuxNative, TransportKind.Sockets },
            { TransportKind.Sockets, TransportKind.LinuxNative },
        };

    public static TheoryData<TransportKind> Kinds =>
        new() { TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxManaged };

    /// <summary>
    /// A second server on a port a first server holds fails to start with Kestrel's IOException wrapping
    /// AddressInUseException, whichever transport each uses, and every later connection still reaches the
    /// first server (a SO_REUSEPORT group silently joined would steal some of them).
    /// </summary>
    [Theory]
    [MemberData(nameof(Pairs))]
    public async Task A_second_server_on_a_held_port_fails_with_AddressInUseException_and_takes_no_connections(TransportKind first, TransportKind second)
    {
        await using var holder = await NamedServer.StartAsync(first, "first", output, k => k.Listen(IPAddress.Loopback, 0));
        var port = new Uri(Assert.Single(holder.Addresses)).Port;
        var endPoint = new IPEndPoint(IPAddress.Loopback, port);

        var failure = await Assert.ThrowsAsync<IOException>(() => NamedServer.StartAsync(second, "second", output, k => k.Listen(endPoint)));
        Assert.IsType<AddressInUseException>(failure.InnerException);
        output.WriteLine($"{second} on {first}'s port: {failure.Message} <- {failure.InnerException!.Message}");

        for (var i = 0; i < 16; i++)
        {
            Assert.Equal("first", await NamedServer.AskAsync(endPoint));
        }
    }

    /// <summary>
    /// Twenty times in a row: a server serves a Connection: close request (the server closes first, so its side
    /// of that connection sits in TIME_WAIT on the port), stops, and a new server binds the same port at once
    /// and serves.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task The_same_port_rebinds_right_after_dispose_20_times_with_a_connection_in_TIME_WAIT(TransportKind kind)
    {
        var port = 0;
        var timeWaits = 0;
        for (var round = 0; round < 20; round++)
        {
            var name = $"round {round}";
            await using (var server = await NamedServer.StartAsync(kind, name, output, k => k.Listen(IPAddress.Loopback, port)))
            {
                port = new Uri(Assert.Single(server.Addresses)).Port;
                var (found, seen) = (false, new List<string>());
                // The kernel closes a socket outright instead of keeping it in TIME_WAIT while its table of them is
                // full (tcp_max_tw_buckets; CI's earlier suites leave 100,000 and more for a minute). Then, and only
                // then, wait for the table to drain and make the connection again.
                for (var attempt = 0; attempt < 3 && !found; attempt++)
                {
                    if (attempt > 0 && !await WaitForTimeWaitRoomAsync())
                    {
                        break;
                    }

                    // Read to the server's FIN before closing, so that the server closes first and its side waits.
                    using (var client = await TestSockets.ConnectAsync(new IPEndPoint(IPAddress.Loopback, port)))
                    {
                        await client.SendAllAsync("GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"u8.ToArray());
                        var response = Encoding.ASCII.GetString(await client.ReceiveToEndAsync());
                        Assert.True(response.StartsWith("HTTP/1.1 200 ", StringComparison.Ordinal) && response.Contains(name, StringComparison.Ordinal), $"Round {round}: unexpected response '{response}'.");
                    }

                    (found, seen) = await WaitForTimeWaitAsync(port);
                }

                Assert.True(found, $"Round {round}: no connection on port {port} reached TIME_WAIT, so the rebind would not prove the point. Its entries in /proc/net/tcp[6] at the last look (local, remote, state): {(seen.Count == 0 ? "none" : string.Join("; ", seen))}. {SocketSummary()}");
                timeWaits++;
            }
        }

        output.WriteLine($"{kind}: 20 rebinds of port {port}, each with a TIME_WAIT connection on it.");
        Assert.Equal(20, timeWaits);
    }

    /// <summary>
    /// Polls /proc/net/tcp and tcp6 for a TIME_WAIT (state 06) entry whose local port is <paramref name="port"/>, for 5 s;
    /// returns whether one appeared, and the port's entries at the last look (for the failure message).
    /// </summary>
    private static async Task<(bool Found, List<string> Seen)> WaitForTimeWaitAsync(int port)
    {
        var hexPort = port.ToString("X4", CultureInfo.InvariantCulture);
        var seen = new List<string>();
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(5);
        do
        {
            seen.Clear();
            foreach (var table in new[] { "/proc/net/tcp", "/proc/net/tcp6" })
            {
                foreach (var line in File.ReadLines(table).Skip(1))
                {
                    var fields = line.Split(' ', StringSplitOptions.RemoveEmptyEntries);
                    if (fields.Length > 3 && fields[1].EndsWith(":" + hexPort, StringComparison.Ordinal))
                    {
                        if (fields[3] == "06")
                        {
                            return (true, seen);
                        }

                        seen.Add($"{fields[1]} {fields[2]} {fields[3]}");
                    }
                }
            }

            await Task.Delay(20);
        }
        while (DateTime.UtcNow < deadline);

        return (false, seen);
    }

    /// <summary>
    /// False when the TIME_WAIT table is not close to full (a missing TIME_WAIT was then not the kernel's refusal, and
    /// trying again would only hide it); otherwise waits, up to 70 s (a TIME_WAIT lasts 60), until it is under 80% full.
    /// </summary>
    private static async Task<bool> WaitForTimeWaitRoomAsync()
    {
        var room = TimeWaitLimit() * 8 / 10;
        if (TimeWaitCount() < room)
        {
            return false;
        }

        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(70);
        while (TimeWaitCount() >= room && DateTime.UtcNow < deadline)
        {
            await Task.Delay(500);
        }

        return TimeWaitCount() < room;
    }

    /// <summary>The "tw" figure of /proc/net/sockstat's TCP line: this network namespace's sockets in TIME_WAIT.</summary>
    private static long TimeWaitCount()
    {
        var fields = SockstatTcp().Split(' ', StringSplitOptions.RemoveEmptyEntries);
        return long.Parse(fields[Array.IndexOf(fields, "tw") + 1], CultureInfo.InvariantCulture);
    }

    private static long TimeWaitLimit() => long.Parse(File.ReadAllText("/proc/sys/net/ipv4/tcp_max_tw_buckets").Trim(), CultureInfo.InvariantCulture);

    /// <summary>The TCP line of /proc/net/sockstat: sockets in use, orphans, TIME_WAIT.</summary>
    private static string SockstatTcp() => File.ReadLines("/proc/net/sockstat").First(l => l.StartsWith("TCP:", StringComparison.Ordinal));

    /// <summary>The TCP line of /proc/net/sockstat and the TIME_WAIT limit.</summary>
    private static string SocketSummary() => $"{SockstatTcp()}; tcp_max_tw_buckets {TimeWaitLimit()}";
}
