using System.Buffers;
using System.Collections.Concurrent;
using System.Runtime.InteropServices;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Interop;

namespace Kestrel.Transport.Linux.Connection;

/// <summary>
/// One connection's zero-copy sends: which of its sends go out zero-copy (<see cref="SendFlags"/>), and those in
/// flight. Each holds the blocks its iovecs pointed into until the kernel says it is done with them, and keeps each
/// one pinned until then: the kernel reads the pages the memory had when it was sent, and a pool need not hand out
/// pinned memory (MemoryPool&lt;byte&gt;.Shared does not, nor need a pool an app registers), so a compacting GC could
/// otherwise move the array and put other objects on those pages.
/// Two kinds, in one queue so that blocks go back in send order:
/// <c>sendmsg(MSG_ZEROCOPY)</c>, which the kernel numbers per socket from 0, one id per call that queued data,
/// and reports done in ranges of ids on the error queue; and an engine's own zero-copy ops (io_uring's
/// SENDMSG_ZC), numbered by the engine, each reported done by itself. Used under the connection's send lock,
/// or on its loop (<see cref="LinuxConnection"/>); <see cref="OnOpDone"/> and <see cref="ReapErrorQueue"/> take
/// the lock themselves.
/// </summary>
internal sealed class ZeroCopySends(uint firstId = 0)
{
    // Blocks of sends the kernel never reported done before their loop ended (Abandon): referenced, and pinned, for good.
    private static readonly ConcurrentQueue<(ZeroCopyBlock Block, MemoryHandle Pin)> s_abandoned = new();

    private readonly List<ZeroCopyBlock> _staged = [];
    private readonly Queue<(ZeroCopyBlock Block, MemoryHandle Pin)> _held = new();
    private readonly List<(uint Id, int Blocks, bool Done, bool Op, bool Sent)> _sends = [];
    private uint _nextId = firstId;
    private uint _stagedOp;

    // Set after ENOBUFS, for the next send only (msg_zerocopy.rst: over the socket's optmem limit).
    private bool _skipNext;

    /// <summary>Set once the kernel reported that it copied a send (loopback, or a device without scatter-gather).</summary>
    public bool KernelCopies { get; private set; }

    public int InFlight => _sends.Count;

    /// <summary>
    /// The op flags for <paramref name="connection"/>'s send of <paramref name="buffer"/>: zero-copy when it is large
    /// enough and its blocks can be held; with the number the engine's own zero-copy op carries where it has one
    /// (<see cref="IoEngine.SendsZeroCopyAsOps"/>). <paramref name="onLoop"/>: for the loop's batch, which the engine
    /// performs (else a pool thread's own).
    /// </summary>
    public int SendFlags(LinuxConnection connection, in ReadOnlySequence<byte> buffer, bool onLoop, out uint tag)
    {
        tag = 0;
        if (buffer.Length < connection.Loop.Options.ZeroCopySendThreshold
            || (KernelCopies && !connection.Loop.Options.Tuning.ZeroCopyWhenKernelCopies))
        {
            return 0;
        }

        if (_skipNext)
        {
            _skipNext = false;
            return 0;
        }

        var engine = connection.Loop.Engine;
        uint send = onLoop && engine.SendsZeroCopyAsOps ? engine.NextZeroCopySend() : 0;
        if (!Stage(buffer, SendSide.MaxBuffersPerSend, send))
        {
            return 0;
        }

        tag = send;
        return NativeEngine.SendZeroCopy;
    }

    /// <summary>
    /// After a send op, with the side owned: a zero-copy send's blocks stay held until the kernel completes it
    /// (before the reader may advance past them); <paramref name="notified"/>: the engine's op will be notified
    /// (<see cref="IoBatch.NotifiesAt"/>). True when it was one the kernel refused for want of memory to pin or
    /// notify (ENOBUFS from sendmsg(MSG_ZEROCOPY): the optmem or the locked-memory limit, msg_zerocopy.rst; ENOMEM
    /// from io_uring's SENDMSG_ZC, whose pages count against RLIMIT_MEMLOCK without CAP_IPC_LOCK since Linux 6.15)
    /// or that the socket cannot send zero-copy (EOPNOTSUPP): the caller sends the same bytes again, and that
    /// send copies. Any other error ends the connection.
    /// </summary>
    public bool AfterSend(LinuxConnection connection, SysResult result, bool notified)
    {
        if (!Commit(result, notified, out uint ringSend))
        {
            return false;
        }

        if (!result.IsError && result.Value > 0)
        {
            connection.Loop.Metrics.ZeroCopySends.Add(1);
        }

        if (ringSend != 0)
        {
            connection.Loop.Engine.AwaitZeroCopy(ringSend, connection);
        }

        _skipNext = result.IsError && result.Error is Errno.ENOBUFS or Errno.ENOMEM or Errno.EOPNOTSUPP;
        if (_skipNext)
        {
            connection.Loop.OnZeroCopyRefused();
        }

        return _skipNext;
    }

    /// <summary>On the loop: the engine's zero-copy op <paramref name="send"/> is done. True when it still held blocks.</summary>
    public bool OnOpDone(LinuxConnection connection, uint send, bool copied)
    {
        bool sent;
        lock (connection.Send.Lock)
        {
            if (!CompleteOp(send, copied, out sent))
            {
                return false;
            }
        }

        if (sent)
        {
            connection.Loop.Metrics.ZeroCopyCompletions.Add(1, copied ? TransportMetrics.Copied : TransportMetrics.NotCopied);
        }

        return true;
    }

    /// <summary>
    /// On the loop, on EPOLLERR: takes the kernel's MSG_ZEROCOPY completions off the socket's error queue and
    /// lets their blocks go. True when there were any.
    /// </summary>
    public bool ReapErrorQueue(LinuxConnection connection)
    {
        bool any = false;
        lock (connection.Send.Lock)
        {
            SysResult read;
            while (!(read = ErrorQueue.ReadZeroCopyCompletion(connection.Socket.Value, out uint first, out uint last, out bool copied)).IsError)
            {
                if (read.Value == 1)
                {
                    any = true;
                    int completed = Complete(first, last, copied);
                    connection.Loop.Metrics.ZeroCopyCompletions.Add(completed, copied ? TransportMetrics.Copied : TransportMetrics.NotCopied);
                }
            }
        }

        return any;
    }

    /// <summary>
    /// Collects the blocks behind the first <paramref name="maxSegments"/> non-empty segments of
    /// <paramref name="buffer"/>; false (and nothing staged) when any of them is memory this pool did not
    /// lend, which a zero-copy send must not point at. <paramref name="op"/>: the engine's number for the send
    /// when it is the engine's own op, else 0 (<c>sendmsg(MSG_ZEROCOPY)</c>).
    /// </summary>
    public bool Stage(in ReadOnlySequence<byte> buffer, int maxSegments, uint op = 0)
    {
        _staged.Clear();
        _stagedOp = op;
        foreach (var segment in buffer)
        {
            if (segment.IsEmpty)
            {
                continue;
            }

            if (!MemoryMarshal.TryGetMemoryManager<byte, ZeroCopyBlock>(segment, out var block))
            {
                _staged.Clear();
                return false;
            }

            _staged.Add(block);
            if (_staged.Count == maxSegments)
            {
                break;
            }
        }

        return _staged.Count > 0;
    }

    /// <summary>
    /// After a send: false when it was not a staged zero-copy send. Otherwise true, and its blocks stay held until
    /// the kernel says it is done with them. A <c>sendmsg(MSG_ZEROCOPY)</c> call that sent bytes took the next id
    /// (<see cref="Complete"/>); a failed one took none and holds nothing. An engine's op is held while its
    /// notification will come (<paramref name="notified"/>, ktl.h), whatever its result, since the kernel may read
    /// its buffers until then; <paramref name="op"/> is then its number (<see cref="CompleteOp"/>), else 0.
    /// </summary>
    public bool Commit(SysResult sent, bool notified, out uint op)
    {
        op = 0;
        if (_staged.Count == 0)
        {
            return false;
        }

        bool sentBytes = !sent.IsError && sent.Value > 0;
        if (_stagedOp != 0 ? notified : sentBytes)
        {
            // Pinned before the batch's own pins go (for a pre-pinned pool's memory that costs no handle).
            foreach (var block in _staged)
            {
                block.AddSend();
                _held.Enqueue((block, block.Pin()));
            }

            if (_stagedOp != 0)
            {
                op = _stagedOp;
                _sends.Add((op, _staged.Count, false, true, sentBytes));
            }
            else
            {
                _sends.Add((_nextId++, _staged.Count, false, false, true));
            }
        }

        _staged.Clear();
        return true;
    }

    /// <summary>
    /// The kernel completed ids <paramref name="first"/>..<paramref name="last"/> (inclusive, modulo 2^32).
    /// Blocks go back in send order, so a send completed ahead of an earlier one waits for it.
    /// Returns the number of sends this completed.
    /// </summary>
    public int Complete(uint first, uint last, bool copied)
    {
        KernelCopies |= copied;
        uint span = last - first;
        int completed = 0;
        for (int i = 0; i < _sends.Count; i++)
        {
            var send = _sends[i];
            if (!send.Done && !send.Op && send.Id - first <= span)
            {
                _sends[i] = send with { Done = true };
                completed++;
            }
        }

        ReleaseDone();
        return completed;
    }

    /// <summary>
    /// The engine's zero-copy op <paramref name="op"/> is done: false when this holds no such send. <paramref name="sent"/>
    /// says whether it had sent bytes (a failed op is held for its notification too, but counts as no send).
    /// </summary>
    public bool CompleteOp(uint op, bool copied, out bool sent)
    {
        int i = 0;
        while (i < _sends.Count && !(_sends[i].Op && !_sends[i].Done && _sends[i].Id == op))
        {
            i++;
        }

        if (i == _sends.Count)
        {
            sent = false;
            return false;
        }

        sent = _sends[i].Sent;
        KernelCopies |= copied && sent;
        _sends[i] = _sends[i] with { Done = true };
        ReleaseDone();
        return true;
    }

    /// <summary>Gives back the blocks of the sends done at the head of the queue (in send order).</summary>
    private void ReleaseDone()
    {
        int finished = 0;
        while (finished < _sends.Count && _sends[finished].Done)
        {
            for (int b = 0; b < _sends[finished].Blocks; b++)
            {
                var (block, pin) = _held.Dequeue();
                pin.Dispose();
                block.ReleaseSend();
            }

            finished++;
        }

        _sends.RemoveRange(0, finished);
    }

    /// <summary>
    /// The loop is ending before the kernel said it is done with these sends: their blocks are kept referenced for the
    /// rest of the process's life instead of going back to a pool (or to the garbage collector, which would reuse
    /// the memory) while the kernel may still send from them. Returns how many blocks were kept.
    /// </summary>
    public int Abandon()
    {
        int blocks = _held.Count;
        while (_held.TryDequeue(out var held))
        {
            s_abandoned.Enqueue(held);
        }

        _sends.Clear();
        _staged.Clear();
        return blocks;
    }

    /// <summary>Blocks kept by <see cref="Abandon"/> in this process (diagnostics and tests).</summary>
    public static int AbandonedBlocks => s_abandoned.Count;
}
